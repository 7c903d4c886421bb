"""Shared plumbing of the benchmarks: Django set-up, databases, data sets, timing, output."""

from __future__ import annotations

import json
import math
import os
import platform
import random
import re
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUTPUT_DIR = ROOT / ".data" / "bench"


def setup_django() -> None:
    """Configure Django with `benchmarks.settings` (idempotent)."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    warnings.simplefilter("ignore", ResourceWarning)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import django

        django.setup()


# --------------------------------------------------------------------------------------------
# Databases


def _conninfo(dbname: str) -> dict[str, Any]:
    from django.db import connection

    settings = connection.settings_dict
    info: dict[str, Any] = {
        "dbname": dbname,
        "host": settings["HOST"],
        "user": settings["USER"],
        "password": settings["PASSWORD"],
        "port": settings["PORT"],
        **settings["OPTIONS"],
    }
    info.pop("server_side_binding", None)  # Django's, not libpq's
    return {key: value for key, value in info.items() if value not in ("", None)}


def raw_connection(dbname: str, *, autocommit: bool = False) -> Any:
    """A plain psycopg connection to `dbname`.

    It binds parameters as Django's connection does, so the server receives exactly the
    statements the product sends: on the client by default (no prepared statements, no
    generic plans), on the server and prepared when `BAILING_BENCH_PREPARE` sets
    `server_side_binding` (`benchmarks.settings`; `prepare_threshold` goes along).
    """
    import psycopg
    from django.db import connection

    server_side = connection.settings_dict["OPTIONS"].get("server_side_binding") is True
    return psycopg.connect(
        **_conninfo(dbname),
        autocommit=autocommit,
        cursor_factory=psycopg.Cursor if server_side else psycopg.ClientCursor,
    )


def maintenance_connection() -> Any:
    return raw_connection("postgres", autocommit=True)


def use_database(name: str) -> None:
    """Point Django's default connection at the database `name` (closing the current one)."""
    from django.db import connection

    connection.close()
    connection.settings_dict["NAME"] = name


def database_exists(name: str) -> bool:
    with maintenance_connection() as conn:
        row = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
    return row is not None


def drop_database(name: str) -> None:
    from psycopg import sql

    with maintenance_connection() as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


def create_database(name: str, *, template: str | None = None) -> None:
    """Create `name` (empty and migrated, or a file copy of `template`)."""
    from django.core.management import call_command
    from psycopg import sql

    drop_database(name)
    with maintenance_connection() as conn:
        if template is None:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        else:
            conn.execute(
                sql.SQL("CREATE DATABASE {} TEMPLATE {} STRATEGY FILE_COPY").format(
                    sql.Identifier(name), sql.Identifier(template)
                )
            )
    if template is None:
        use_database(name)
        call_command("migrate", verbosity=0)


def database_version(name: str) -> str | None:
    """The build version recorded on a benchmark database, or None."""
    if not database_exists(name):
        return None
    with maintenance_connection() as conn:
        row = conn.execute(
            "SELECT shobj_description(oid, 'pg_database') FROM pg_database WHERE datname = %s",
            [name],
        ).fetchone()
    return row[0] if row else None


def set_database_version(name: str, version: str) -> None:
    from psycopg import sql

    with maintenance_connection() as conn:
        conn.execute(
            sql.SQL("COMMENT ON DATABASE {} IS {}").format(
                sql.Identifier(name), sql.Literal(version)
            )
        )


def server_facts(dbname: str) -> dict[str, Any]:
    """PostgreSQL, pgvector and the settings that matter for the figures."""
    with raw_connection(dbname, autocommit=True) as conn:
        facts: dict[str, Any] = {
            "postgresql": conn.execute("SHOW server_version").fetchone()[0],
            "pgvector": conn.execute(
                "SELECT extversion FROM pg_extension WHERE extname = 'vector'"
            ).fetchone()[0],
        }
        for name in ("shared_buffers", "work_mem", "synchronous_commit", "jit"):
            facts[name] = conn.execute(f"SHOW {name}").fetchone()[0]
    facts["python"] = platform.python_version()
    facts["cpus"] = os.cpu_count()
    return facts


# The app's tables, their indexes and their TOAST tables.
_APP_RELATIONS = """
SELECT c.oid FROM pg_class c
WHERE c.relkind IN ('r', 'i', 't')
  AND (c.relname LIKE 'bailing\\_knowledge\\_%' OR c.relname LIKE 'bk\\_%'
       OR c.oid IN (SELECT reltoastrelid FROM pg_class
                    WHERE relname LIKE 'bailing\\_knowledge\\_%'))
"""


def prewarm(dbname: str) -> dict[str, Any]:
    """Read every page of the app's relations once (`pg_prewarm` in `read` mode) before
    anything is timed, so that no timed search waits for the disk.

    After a server restart or a dropped page cache, the first searches read their pages from
    disk: at 1M chunks the first pass over the test queries ran at 45 ms a search at the
    median against 8 ms on the next (docs/deployment.md), and some legs hit their statement
    timeout while the searches were being captured. `read` mode fills the operating system's
    cache only: shared buffers are still filled by the searches themselves, in the order they
    touch pages, as on a server that has been serving. (Loading them in relation order with
    the default `buffer` mode slows searches, the vector SQL most, so the ratios would fall:
    docs/performance.md.) Where the extension cannot be created (no contrib package, no
    privilege), nothing is read and the reason is returned."""
    import psycopg

    try:
        with raw_connection(dbname, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_prewarm")
            start = time.perf_counter()
            read = conn.execute(
                "SELECT coalesce(sum(pg_prewarm(oid, 'read')), 0)::bigint"  # noqa: S608
                " * current_setting('block_size')::bigint"
                f" FROM ({_APP_RELATIONS}) r"
            ).fetchone()[0]
            seconds = time.perf_counter() - start
    except psycopg.Error as exc:
        return {"prewarmed": False, "reason": str(exc).strip().splitlines()[0]}
    return {"prewarmed": True, "mb": round(read / 2**20, 1), "s": round(seconds, 1)}


def code_version() -> dict[str, Any]:
    """The commit measured, and the product files changed on top of it (if any)."""
    import subprocess

    def git(*args: str) -> str:
        try:
            return subprocess.run(
                ["git", *args], cwd=ROOT, capture_output=True, text=True, check=True
            ).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return ""

    changed = git("status", "--porcelain", "--", "bailing_knowledge").splitlines()
    return {"commit": git("rev-parse", "--short", "HEAD"), "uncommitted": changed}


# --------------------------------------------------------------------------------------------
# Data sets (BEIR layout)


@dataclass(frozen=True)
class BeirDataset:
    name: str
    corpus: dict[str, tuple[str, str]]  # id -> (title, text)
    queries: dict[str, str]
    qrels: dict[str, dict[str, int]]  # query id -> {doc id: grade}


def load_beir(path: Path, split: str = "test") -> BeirDataset:
    corpus: dict[str, tuple[str, str]] = {}
    with (path / "corpus.jsonl").open(encoding="utf-8") as lines:
        for line in lines:
            row = json.loads(line)
            corpus[row["_id"]] = (row.get("title") or "", row.get("text") or "")
    queries: dict[str, str] = {}
    with (path / "queries.jsonl").open(encoding="utf-8") as lines:
        for line in lines:
            row = json.loads(line)
            queries[row["_id"]] = row["text"]
    qrels: dict[str, dict[str, int]] = {}
    with (path / "qrels" / f"{split}.tsv").open(encoding="utf-8") as lines:
        for number, line in enumerate(lines):
            parts = line.rstrip("\r\n").split("\t")
            if number == 0 and parts[0] == "query-id":
                continue
            query_id, doc_id, grade = parts[0], parts[1], int(parts[2])
            if grade > 0:
                qrels.setdefault(query_id, {})[doc_id] = grade
    return BeirDataset(path.resolve().name, corpus, queries, qrels)


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9(])")


def synthetic_documents(
    corpus: Sequence[tuple[str, str]], *, seed: int, min_parts: int = 4, max_parts: int = 12
) -> Iterator[tuple[str, str]]:
    """Endless realistic documents: each joins several abstracts, varied copy by copy.

    Each abstract copy loses one random sentence (when it has more than three) and is
    rotated to start at a random sentence, so the same abstract never yields the same
    chunk twice; the vocabulary and term frequencies stay those of the real corpus.
    """
    rng = random.Random(seed)
    split = [
        (title, _SENTENCE_END.split(text.strip()))
        for title, text in corpus
        if title.strip() and len(text) > 200
    ]
    while True:
        parts = []
        picked = [rng.choice(split) for _ in range(rng.randint(min_parts, max_parts))]
        for title, sentences in picked:
            sentences = list(sentences)
            if len(sentences) > 3:
                del sentences[rng.randrange(len(sentences))]
            turn = rng.randrange(len(sentences))
            parts.append(title + "\n\n" + " ".join(sentences[turn:] + sentences[:turn]))
        yield picked[0][0][:200], "\n\n".join(parts)


# --------------------------------------------------------------------------------------------
# Timing and statistics


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) with linear interpolation."""
    if not values:
        return math.nan
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summary_ms(seconds: Sequence[float]) -> dict[str, float]:
    ms = [s * 1000 for s in seconds]
    return {
        "n": len(ms),
        "p50_ms": round(percentile(ms, 50), 3),
        "p95_ms": round(percentile(ms, 95), 3),
        "mean_ms": round(statistics.fmean(ms), 3) if ms else math.nan,
    }


def ratio(a: float, b: float) -> float:
    return round(a / b, 2) if b else math.nan


def timed(function: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    result = function()
    return time.perf_counter() - start, result


# --------------------------------------------------------------------------------------------
# Output


@dataclass(frozen=True)
class Target:
    """One acceptance target: `measured` against `limit`, an upper bound unless `at_least`."""

    name: str
    measured: float
    limit: float
    at_least: bool = False
    decimals: int = 3

    @property
    def passed(self) -> bool:
        return self.measured >= self.limit if self.at_least else self.measured <= self.limit

    def line(self) -> str:
        """`TARGET <name> <measured> <limit> PASS|FAIL`, the line scripts read."""
        verdict = "PASS" if self.passed else "FAIL"
        measured, limit = (plain_number(x, self.decimals) for x in (self.measured, self.limit))
        return f"TARGET {self.name} {measured} {limit} {verdict}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "measured": self.measured,
            "limit": self.limit,
            "at_least": self.at_least,
            "passed": self.passed,
        }


def plain_number(value: float, decimals: int = 3) -> str:
    """A plain decimal number: no exponent, at most `decimals` decimals."""
    return f"{value:.{decimals}f}".rstrip("0").rstrip(".")


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """A GitHub-style Markdown table on stdout (paste-able into the docs)."""
    cells = [[_cell(value) for value in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    print("| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in cells:
        print("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |")
    print()


def _cell(value: Any) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        return f"{value:.4f}" if abs(value) < 1 else f"{value:.2f}"
    return str(value)


def write_json(name: str, data: dict[str, Any]) -> Path:
    OUTPUT_DIR.mkdir(parents=True, exist_ok=True)
    path = OUTPUT_DIR / name
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return path


def heading(text: str) -> None:
    print(f"\n## {text}\n", flush=True)
