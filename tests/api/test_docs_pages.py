"""Swagger UI and ReDoc come from the installed package, so they render with no network."""

from __future__ import annotations

import re
import subprocess
from html.parser import HTMLParser

import httpx
import pytest
from django.contrib.staticfiles import finders

from tests.browser import CHROMIUM, HEADLESS_FLAGS


class _Assets(HTMLParser):
    """Every script, stylesheet and icon a page loads."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag, attrs):
        attributes = dict(attrs)
        if tag == "script" and attributes.get("src"):
            self.urls.append(attributes["src"])
        if tag == "link" and attributes.get("href"):
            self.urls.append(attributes["href"])


def _assets(html: str) -> list[str]:
    parser = _Assets()
    parser.feed(html)
    return parser.urls


@pytest.mark.parametrize("page", ["/api/docs/", "/api/redoc/"])
def test_the_docs_pages_load_only_local_assets(live_server, page):
    html = httpx.get(live_server.url + page).text
    urls = _assets(html)
    assert urls, html
    # Inline scripts may not fetch from elsewhere either (Swagger UI's init script).
    assert not re.search(r"https?://(?!127\.0\.0\.1|localhost)", html), html
    for url in urls:
        assert url.startswith("/static/drf_spectacular_sidecar/"), url
        assert finders.find(url.removeprefix("/static/")), url
        assert httpx.get(live_server.url + url).status_code == 200, url


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium on this machine")
def test_swagger_ui_renders_the_agent_api_in_a_browser(live_server, tmp_path):
    """Headless Chromium, with its background networking off, draws the operations."""
    command = [
        CHROMIUM,
        *HEADLESS_FLAGS,
        f"--user-data-dir={tmp_path / 'profile'}",
        "--window-size=1280,1600",
        "--virtual-time-budget=10000",
    ]
    url = live_server.url + "/api/docs/"
    dom = subprocess.run(
        [*command, "--dump-dom", url], capture_output=True, text=True, timeout=120
    ).stdout
    assert 'class="opblock-summary-path"' in dom or "opblock-summary-path" in dom, dom[-2000:]
    assert "/knowledge/search" in dom
    shot = tmp_path / "swagger.png"
    subprocess.run(
        [*command, f"--screenshot={shot}", url], capture_output=True, timeout=120, check=True
    )
    assert shot.stat().st_size > 10_000
