"""The test settings: a run of database-free tests starts no PostgreSQL."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from bailing_knowledge.embedded import DATA_DIR_ENV, DATABASE_URL_ENV

ROOT = Path(__file__).resolve().parent.parent


def test_database_free_tests_start_no_server(tmp_path):
    folder = tmp_path / "pgdata"
    env = {k: v for k, v in os.environ.items() if k not in (DATABASE_URL_ENV, "PYTEST_ADDOPTS")}
    env[DATA_DIR_ENV] = str(folder)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_layers.py"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "passed" in done.stdout
    # The embedded server creates its folder before anything else.
    assert not folder.exists()
