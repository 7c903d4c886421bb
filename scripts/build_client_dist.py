"""Build `bailing-knowledge-client`: the HTTP client, tool definitions and MCP server alone.

An agent host needs httpx (and the `mcp` SDK for the MCP server), not Django, DRF, psycopg
or pgvector. This distribution is built from the same source files as `bailing-knowledge`
(the package's `__init__`, `constants` and `client` subpackage), with the dependencies of
the full distribution's `client` and `mcp` extras, so the two cannot drift apart. The full
distribution already contains the client: install one or the other in an environment.

    python scripts/build_client_dist.py OUTDIR   # prints the wheel's path
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NAME = "bailing-knowledge-client"
FILES = ["__init__.py", "constants.py", "py.typed"]

README = """# bailing-knowledge-client

The agent side of [bailing-knowledge](https://github.com/bailing-knowledge/bailing-knowledge):
the Python client of its agent knowledge API (`bailing_knowledge.client`), tool definitions
for OpenAI- and Anthropic-style tool calling, and the MCP server `bailing-knowledge-mcp`
(extra `mcp`). It depends on httpx (and the httpcore and anyio it brings), not on Django:
a business system runs the full `bailing-knowledge` distribution, which contains this client
too.
"""


def _toml_list(values: list[str]) -> str:
    return "[" + ", ".join(f'"{value}"' for value in values) + "]"


def pyproject(version: str) -> str:
    """The client distribution's metadata, its dependencies taken from the full one's extras."""
    full = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = full["optional-dependencies"]
    client = extras["client"]
    mcp = [requirement for requirement in extras["mcp"] if requirement not in client]
    return f"""[build-system]
requires = ["setuptools>=77"]
build-backend = "setuptools.build_meta"

[project]
name = "{NAME}"
version = "{version}"
description = "HTTP client, LLM tool definitions and MCP server for bailing-knowledge."
readme = "README.md"
requires-python = "{full["requires-python"]}"
license = "MIT"
authors = [{{ name = "bailing_knowledge contributors" }}]
dependencies = {_toml_list(client)}

[project.optional-dependencies]
mcp = {_toml_list(mcp)}

[project.scripts]
bailing-knowledge-mcp = "bailing_knowledge.client.mcp_server:main"

[tool.setuptools]
packages = ["bailing_knowledge", "bailing_knowledge.client"]

[tool.setuptools.package-data]
bailing_knowledge = ["py.typed"]
"""


def version() -> str:
    text = (ROOT / "bailing_knowledge" / "__init__.py").read_text()
    match = re.search(r'__version__ = "([^"]+)"', text)
    if match is None:
        raise SystemExit("bailing_knowledge/__init__.py has no __version__")
    return match.group(1)


def build(outdir: Path) -> Path:
    outdir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bk-client-dist-") as stage_dir:
        stage = Path(stage_dir)
        package = stage / "bailing_knowledge"
        shutil.copytree(
            ROOT / "bailing_knowledge" / "client",
            package / "client",
            ignore=shutil.ignore_patterns("__pycache__"),
        )
        for name in FILES:
            shutil.copy2(ROOT / "bailing_knowledge" / name, package / name)
        shutil.copy2(ROOT / "LICENSE", stage / "LICENSE")
        (stage / "README.md").write_text(README)
        (stage / "pyproject.toml").write_text(pyproject(version()))
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "--quiet",
                "--no-deps",
                "-w",
                str(outdir),
                str(stage),
            ],
            check=True,
        )
    wheels = sorted(outdir.glob(f"bailing_knowledge_client-{version()}-*.whl"))
    if not wheels:
        raise SystemExit("the client wheel was not built")
    return wheels[-1]


if __name__ == "__main__":
    print(build(Path(sys.argv[1] if len(sys.argv) > 1 else ROOT / "dist")))
