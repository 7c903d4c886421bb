"""The example project as `benchmarks.serving` serves it: production-like, throttles off.

DEBUG off (no query log kept per request), persistent connections with health checks (as
the example already has), no throttles (one token sends thousands of searches a minute
here, which the default rates would answer with 429), and the app's default embedder, the
hashing one, so that the figures compare servers rather than embedders.
"""

from example.settings import *  # noqa: F403

DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
BAILING_KNOWLEDGE = {"THROTTLE_RATES": None}
