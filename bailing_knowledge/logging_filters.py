"""A logging filter for the host: no credentials from query strings in any log line.

Agents send their token in the `Authorization` header, and the app ignores query strings.
A misconfigured client may still put a token in the URL, and then the access log of the
server in front (runserver, gunicorn, uvicorn) would keep it. Installed on a handler, this
filter replaces such a query string with `?[redacted]` before the line is written:

    LOGGING = {
        "version": 1,
        "filters": {
            "no_credentials": {"()": "bailing_knowledge.logging_filters.CredentialQueryFilter"}
        },
        "handlers": {
            "console": {"class": "logging.StreamHandler", "filters": ["no_credentials"]}
        },
        ...
    }
"""

from __future__ import annotations

import logging
import re

from .constants import ACCESS_TOKEN_PREFIX

# A query string: from `?` to the next space, quote or end of the line.
_QUERY = re.compile(r"\?[^\s\"'<>]*")
# Parameter names that carry credentials, and our token format as any value.
_CREDENTIAL = re.compile(
    r"(?:^|[?&;])[^=&;]*(?:token|auth|key|secret|passw|pwd|session|signature|credential|"
    r"bearer|jwt|code)[^=&;]*="
    rf"|{re.escape(ACCESS_TOKEN_PREFIX)}",
    re.IGNORECASE,
)
REDACTED = "?[redacted]"


def redact_query_strings(text: str) -> str:
    """`text` with every query string that carries a credential replaced by `?[redacted]`."""
    return _QUERY.sub(lambda m: REDACTED if _CREDENTIAL.search(m.group()) else m.group(), text)


class CredentialQueryFilter(logging.Filter):
    """Rewrites records whose message holds a credential-bearing query string; keeps them."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a record whose arguments do not fit its format: leave it be
            return True
        if "?" not in message:
            return True
        redacted = redact_query_strings(message)
        if redacted != message:
            record.msg, record.args = redacted, ()
        return True
