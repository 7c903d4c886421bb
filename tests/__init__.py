"""Helpers shared by test modules that start processes of their own."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote


def connection_url(conninfo: dict[str, Any], dbname: str) -> str:
    """A `postgresql://` URL for a process of the test's, the password included.

    `conninfo` has the keys of a Django `DATABASES` entry in lower case (user, password, host,
    port); a host that is a socket folder goes in the query string, as libpq allows.
    """
    user = quote(conninfo.get("user") or "", safe="")
    password = conninfo.get("password") or ""
    auth = f"{user}:{quote(password, safe='')}@" if password else (f"{user}@" if user else "")
    params = {"host": conninfo.get("host"), "port": conninfo.get("port")}
    query = "&".join(f"{k}={quote(str(v), safe='/')}" for k, v in params.items() if v)
    url = f"postgresql://{auth}/{quote(dbname, safe='')}"
    return f"{url}?{query}" if query else url


def django_connection_url(settings_dict: dict[str, Any]) -> str:
    """The URL of a Django connection's database (the test database during a test)."""
    return connection_url(
        {key.lower(): settings_dict[key] for key in ("USER", "PASSWORD", "HOST", "PORT")},
        settings_dict["NAME"],
    )
