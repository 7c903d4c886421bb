"""Settings of the live server the fault tests start on a database of their own."""

from tests.settings import *  # noqa: F403

# Persistent, health-checked connections: the setting where a frozen database used to hold
# requests for as long as it was frozen.
DATABASES["default"].update(CONN_MAX_AGE=60, CONN_HEALTH_CHECKS=True)  # noqa: F405
DATABASES["default"].pop("TEST", None)  # noqa: F405
