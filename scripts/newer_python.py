"""Find or build a Python 3.12+ interpreter, for the test run under Django 6 (`make test-django6`).

Django 6 needs Python 3.12 or newer; the project supports 3.11, and a machine with 3.11 only
still has to run the suite under Django 6. The interpreter is, in order:

1. `$NEWER_PYTHON`, when set (a path or a command name);
2. the first of ``python3.14``, ``python3.13``, ``python3.12`` on the PATH;
3. one built here before, under ``PREFIX``;
4. CPython built from source into ``PREFIX``. The source comes from the Debian archive, whose
   mirrors apt already reaches (the tarball of Debian 13's python3.13 package is the upstream
   release), and is checked against its SHA-256 before it is unpacked. Building takes about
   two minutes on two cores and needs a C compiler and the headers of OpenSSL, zlib, libffi,
   bzip2, xz and SQLite (Debian: ``build-essential libssl-dev zlib1g-dev libffi-dev
   libbz2-dev liblzma-dev libsqlite3-dev``).

    python scripts/newer_python.py PREFIX   # prints the interpreter's path
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
from pathlib import Path

VERSION = "3.13.5"
SOURCE_URL = "http://deb.debian.org/debian/pool/main/p/python3.13/python3.13_3.13.5.orig.tar.xz"
SOURCE_SHA256 = "93e583f243454e6e9e4588ca2c2662206ad961659863277afcdb96801647d640"
CANDIDATES = ("python3.14", "python3.13", "python3.12")
# Modules the suite needs that are built only when their headers are present.
NEEDED_MODULES = ("_ssl", "_sqlite3", "_ctypes", "_lzma", "_bz2", "zlib")


def is_newer(python: str) -> bool:
    """Whether `python` runs and is 3.12 or newer."""
    try:
        done = subprocess.run(
            [python, "-c", "import sys; sys.exit(sys.version_info < (3, 12))"],
            capture_output=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def download(url: str, target: Path, sha256: str) -> None:
    digest = hashlib.sha256()
    with urllib.request.urlopen(url, timeout=60) as response, target.open("wb") as out:  # noqa: S310
        while block := response.read(1 << 20):
            digest.update(block)
            out.write(block)
    if digest.hexdigest() != sha256:
        raise SystemExit(f"{url}: SHA-256 {digest.hexdigest()}, expected {sha256}")


def build(prefix: Path) -> Path:
    """Build CPython `VERSION` into `prefix`. The build tree is temporary and the install is
    staged beside `prefix`, then renamed into place: an interrupted build leaves no half of
    an interpreter behind to be taken for a whole one."""
    prefix.parent.mkdir(parents=True, exist_ok=True)
    stage = prefix.parent / f"{prefix.name}.partial"
    shutil.rmtree(stage, ignore_errors=True)
    shutil.rmtree(prefix, ignore_errors=True)
    with tempfile.TemporaryDirectory(prefix="newer-python-") as work:
        archive = Path(work) / "source.tar.xz"
        print(f"Building Python {VERSION} into {prefix} (about two minutes)", file=sys.stderr)
        download(SOURCE_URL, archive, SOURCE_SHA256)
        with tarfile.open(archive) as tar:
            tar.extractall(work, filter="data")
        source = Path(work) / f"Python-{VERSION}"
        jobs = str(os.cpu_count() or 2)
        log = Path(work) / "build.log"
        with log.open("w") as out:
            for command in (
                ["./configure", f"--prefix={prefix}", "--without-ensurepip"],
                ["make", f"-j{jobs}"],
                ["make", "install", f"DESTDIR={stage}"],
            ):
                if subprocess.run(command, cwd=source, stdout=out, stderr=out).returncode:
                    sys.stderr.write(log.read_text()[-4000:])
                    raise SystemExit(f"building Python {VERSION} failed at: {' '.join(command)}")
    (stage / prefix.relative_to(prefix.anchor)).rename(prefix)
    shutil.rmtree(stage)
    python = prefix / "bin" / "python3"
    missing = subprocess.run(
        [
            str(python),
            "-c",
            "import importlib.util, sys; "
            "print(' '.join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))",
            *NEEDED_MODULES,
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    if missing:
        shutil.rmtree(prefix)
        raise SystemExit(
            f"Python {VERSION} was built without {', '.join(missing)}: install the headers "
            "named in scripts/newer_python.py and run again"
        )
    return python


def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    prefix = Path(sys.argv[1]).resolve()
    wanted = os.environ.get("NEWER_PYTHON")
    if wanted:
        if not is_newer(wanted):
            raise SystemExit(f"NEWER_PYTHON={wanted} is not a Python 3.12 or newer")
        print(wanted)
        return
    for name in CANDIDATES:
        found = shutil.which(name)
        if found and is_newer(found):
            print(found)
            return
    built = prefix / "bin" / "python3"
    print(built if is_newer(str(built)) else build(prefix))


if __name__ == "__main__":
    main()
