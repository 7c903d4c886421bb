"""Headless Chromium for the browser checks: where it is, and the flags it needs here."""

from __future__ import annotations

import shutil

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")

# Without the background-networking flags Chromium keeps trying hosts a closed network
# refuses; as root it needs --no-sandbox.
HEADLESS_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
