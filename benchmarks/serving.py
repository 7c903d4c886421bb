"""Search throughput and latency through an HTTP server, as docs/deployment.md publishes them.

    make bench-serving          # or: python -m benchmarks.serving [--seconds 20]

Serves the example project (DEBUG off, throttles off, persistent connections) with the demo
knowledge base, in turn under `runserver`, gunicorn (gthread) and granian (WSGI), and drives
`POST .../knowledge/search` with wrk's keep-alive connections, 8 and then 32 at a time,
rotating five questions. Needs `wrk` (Debian's package) and the `deploy` extra (gunicorn,
granian). Each server gets a warm-up first; a run counts only if every answer was a 200.
Its own embedded PostgreSQL lives in `.data/serving-pgdata`.
"""

from __future__ import annotations

import argparse
import io
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "example_project"
CORES = os.cpu_count() or 1
WORKERS = CORES
THREADS = 4
CLIENTS = (8, 32)

QUESTIONS = [
    "how long do refunds take",
    "express shipping cost",
    "warranty repair",
    "退货政策",
    "return unused items",
]

LUA = """
local bodies = {%s}
local i = 0
request = function()
  i = i %% #bodies + 1
  return wrk.format("POST", nil, {
    ["Authorization"] = "Bearer %s",
    ["Content-Type"] = "application/json",
  }, bodies[i])
end
"""


def _gunicorn(bind: str, threads: int) -> list[str]:
    return [
        sys.executable, "-m", "gunicorn", "example.wsgi:application",
        "--workers", str(WORKERS), "--worker-class", "gthread", "--threads", str(threads),
        "--keep-alive", "75", "--bind", bind, "--log-level", "warning",
    ]  # fmt: skip


def servers(port: int) -> dict[str, list[str]]:
    """The configurations compared: one worker per core, and a thread count to vary."""
    bind = f"127.0.0.1:{port}"
    return {
        "runserver": [sys.executable, str(EXAMPLE / "manage.py"), "runserver", bind, "--noreload"],
        f"gunicorn gthread {WORKERS}x{THREADS}": _gunicorn(bind, THREADS),
        f"gunicorn gthread {WORKERS}x{2 * THREADS}": _gunicorn(bind, 2 * THREADS),
        f"granian wsgi {WORKERS}x{THREADS}": [
            sys.executable, "-m", "granian", "--interface", "wsgi",
            "--workers", str(WORKERS), "--blocking-threads", str(THREADS),
            "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning",
            "example.wsgi:application",
        ],
    }  # fmt: skip


def _env() -> dict[str, str]:
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "benchmarks.serving_settings",
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(EXAMPLE)]),
        "BAILING_PGDATA": os.environ.get("BAILING_PGDATA")
        or str(ROOT / ".data" / "serving-pgdata"),
        "BAILING_PG_SHARED_BUFFERS": os.environ.get("BAILING_PG_SHARED_BUFFERS") or "256MB",
    }


def seed() -> str:
    """Migrate, seed the demo and return a fresh agent token (in this process: a user)."""
    os.environ.update(_env())
    sys.path[:0] = [str(ROOT), str(EXAMPLE)]
    import django
    from django.core.management import call_command

    django.setup()
    out = io.StringIO()
    call_command("demo", no_serve=True, stdout=out)
    match = re.search(r"BAILING_ACCESS_TOKEN=(\S+)", out.getvalue())
    if match is None:
        raise SystemExit("the demo printed no token")
    return match.group(1)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_ready(url: str, token: str, process: subprocess.Popen[bytes]) -> None:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})  # noqa: S310
    for _ in range(150):
        if process.poll() is not None:
            raise SystemExit(f"the server exited with {process.returncode}")
        try:
            with urllib.request.urlopen(request, timeout=5) as answer:  # noqa: S310 - loopback
                if answer.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise SystemExit("the server did not answer")


def wrk(url: str, script: Path, clients: int, seconds: int) -> dict[str, float]:
    threads = min(clients, 2)
    out = subprocess.run(
        ["wrk", "-t", str(threads), "-c", str(clients), "-d", f"{seconds}s", "--latency",
         "-s", str(script), url],
        capture_output=True, text=True, check=True, timeout=seconds + 60,
    ).stdout  # fmt: skip
    if "Non-2xx" in out or "Socket errors" in out:
        raise SystemExit(f"not every answer was a 200:\n{out}")
    figures = {"rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))}
    for percentile in ("50", "90", "99"):
        value, unit = re.search(rf"\s{percentile}%\s+([\d.]+)(us|ms|s)", out).groups()
        figures[f"p{percentile}"] = float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=20, help="per measurement")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed (apt-get install wrk)")
    token = seed()
    bodies = ", ".join(f'\'{{"query": "{q}"}}\'' for q in QUESTIONS)
    results: list[tuple[str, int, dict[str, float]]] = []
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "search.lua"
        script.write_text(LUA % (bodies, token))
        port = free_port()
        base = f"http://127.0.0.1:{port}/agent-api/v1/workspaces/demo/knowledge"
        for name, command in servers(port).items():
            process = subprocess.Popen(command, env=_env(), cwd=EXAMPLE)
            try:
                wait_ready(f"{base}/capabilities", token, process)
                wrk(f"{base}/search", script, 8, 5)  # warm-up: connections, caches, plans
                for clients in CLIENTS:
                    figures = wrk(f"{base}/search", script, clients, args.seconds)
                    results.append((name, clients, figures))
                    print(
                        f"SERVING {name!r} clients={clients} rps={figures['rps']:.0f} "
                        f"p50={figures['p50']:.1f}ms p90={figures['p90']:.1f}ms "
                        f"p99={figures['p99']:.1f}ms",
                        flush=True,
                    )
            finally:
                process.send_signal(signal.SIGTERM)
                process.wait(60)
    print()
    print(f"{CORES} cores; wrk keep-alive connections; {args.seconds} s per line")
    print()
    print("| server | clients | searches/s | p50 ms | p90 ms | p99 ms |")
    print("|---|---|---|---|---|---|")
    for name, clients, f in results:
        print(
            f"| {name} | {clients} | {f['rps']:.0f} | {f['p50']:.1f} | {f['p90']:.1f} "
            f"| {f['p99']:.1f} |"
        )


if __name__ == "__main__":
    main()
