"""scripts/newer_python.py: the interpreter of `make test-django6`, found or built from a
checked source. The build itself runs in CI (`.ci/run`), where the machine has only 3.11."""

from __future__ import annotations

import hashlib
import importlib.util
import subprocess
import sys
import threading
from collections.abc import Iterator
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "newer_python.py"
spec = importlib.util.spec_from_file_location("newer_python", SCRIPT)
newer_python = importlib.util.module_from_spec(spec)
spec.loader.exec_module(newer_python)


@pytest.fixture
def served(tmp_path) -> Iterator[tuple[str, bytes]]:
    """A file served over HTTP from a real local server: its URL and its bytes."""
    body = b"not really a tarball\n" * 1000
    (tmp_path / "served").mkdir()
    (tmp_path / "served" / "source.tar.xz").write_bytes(body)
    handler = partial(SimpleHTTPRequestHandler, directory=str(tmp_path / "served"))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/source.tar.xz", body
    finally:
        server.shutdown()
        server.server_close()


def test_download_keeps_a_source_whose_digest_matches(served, tmp_path):
    url, body = served
    target = tmp_path / "source.tar.xz"
    newer_python.download(url, target, hashlib.sha256(body).hexdigest())
    assert target.read_bytes() == body


def test_download_refuses_a_source_whose_digest_differs(served, tmp_path):
    url, body = served
    with pytest.raises(SystemExit, match=hashlib.sha256(body).hexdigest()):
        newer_python.download(url, tmp_path / "source.tar.xz", "0" * 64)


def test_is_newer_tells_versions_apart():
    assert newer_python.is_newer(sys.executable) == (sys.version_info >= (3, 12))
    assert not newer_python.is_newer("/nonexistent/python3.13")


def test_an_interpreter_named_by_the_environment_is_taken_only_if_new_enough(tmp_path):
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path / "prefix")],
        env={"NEWER_PYTHON": sys.executable, "PATH": ""},
        capture_output=True,
        text=True,
    )
    if sys.version_info >= (3, 12):
        assert (done.returncode, done.stdout.strip()) == (0, sys.executable)
    else:
        assert done.returncode == 1
        assert "is not a Python 3.12 or newer" in done.stderr
    assert not (tmp_path / "prefix").exists()
