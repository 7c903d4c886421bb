"""The package's import graph keeps its layer order, has no cycle and no private reach-in.

Read from the source with `ast` (nothing is imported), so imports inside functions count as
much as those at the top. docs/contributing.md explains the layers; `LAYERS` is their one
definition, and a module in no layer fails the test until it is given one.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = "bailing_knowledge"
ROOT = Path(__file__).resolve().parent.parent / PACKAGE

# Bottom to top: a module may import its own layer and those below, never one above.
LAYERS: list[tuple[str, set[str]]] = [
    (
        "leaf",
        {
            "",  # the package itself: its version
            "access",
            "budget",
            "conf",
            "constants",
            "database",
            "deadline",
            "embedded",
            "exceptions",
            "logging_filters",
            "locks",
            "lookups",
            "markdown",
            "models",
            "prefetch",
            "renderers",
            "signals",
            "signing",
            "statements",
        },
    ),
    ("retrieval", {"retrieval"}),
    ("ingestion", {"ingestion"}),
    ("services", {"services"}),
    (
        "http",
        {
            "authentication",
            "middleware",
            "openapi",
            "parsers",
            "permissions",
            "serializers",
            "throttling",
            "urls",
            "views",
        },
    ),
    # What Django or a person starts: they wire the layers below together.
    ("entry", {"admin", "apps", "checks", "management", "migrations"}),
]
LAYER_OF = {group: index for index, (_, groups) in enumerate(LAYERS) for group in groups}

# Within ingestion, one module per step, bottom to top: each imports only those before it.
# `documents` re-exports the steps as the stable import path, so it comes last.
INGESTION = [
    "tasks",
    "library_log",
    "loaders",
    "chunker",
    "lexicon",
    "outcomes",
    "validation",
    "preparation",
    "storage",
    "pipeline",
    "maintenance",
    "documents",
]

# The agent-side client runs in another process, often without Django: it stands apart and
# may use only the wire constants and the package version.
STANDALONE = {"client": {"", "constants", "client"}}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for path in sorted(ROOT.rglob("*.py"))}


def group_of(module: str) -> str:
    """The unit layers are given to: a subpackage, or a top-level module ("" the package)."""
    parts = module.split(".")[1:]
    return parts[0] if parts else ""


def _is_package(module: str) -> bool:
    return MODULES[module].name == "__init__.py"


def imports(module: str) -> Iterator[tuple[int, str, list[str]]]:
    """(line, imported module of this package, names taken from it) for every import."""
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == PACKAGE:
                    yield node.lineno, alias.name, []
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                package = module if _is_package(module) else module.rsplit(".", 1)[0]
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module or ""
            if base.split(".")[0] != PACKAGE:
                continue
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                if submodule in MODULES:
                    yield node.lineno, submodule, []
                else:
                    yield node.lineno, base, [alias.name]


def _edges() -> Iterator[tuple[str, int, str, list[str]]]:
    for module in MODULES:
        for line, target, names in imports(module):
            yield module, line, target, names


def test_every_module_has_a_layer():
    unplaced = sorted(
        module
        for module in MODULES
        if group_of(module) not in LAYER_OF and group_of(module) not in STANDALONE
    )
    assert not unplaced, f"give these a layer in tests/test_layers.py: {unplaced}"


def test_no_import_goes_up_a_layer():
    upward = []
    for module, line, target, _ in _edges():
        source, imported = group_of(module), group_of(target)
        if source in STANDALONE:
            ok = imported in STANDALONE[source]
        elif imported in STANDALONE:
            ok = False  # the server never depends on the agent-side client
        else:
            ok = LAYER_OF.get(imported, len(LAYERS)) <= LAYER_OF.get(source, -1)
        if not ok:
            upward.append(f"{MODULES[module].relative_to(ROOT.parent)}:{line} imports {target}")
    assert not upward, "imports against the layer order:\n" + "\n".join(upward)


def test_no_cycle_between_subpackages_or_modules():
    graph: dict[str, set[str]] = {}
    for module, _, target, _ in _edges():
        source, imported = group_of(module), group_of(target)
        if source != imported and imported:
            graph.setdefault(source, set()).add(imported)
    cycles = []
    state: dict[str, int] = {}  # 1 on the current path, 2 done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for following in sorted(graph.get(node, ())):
            if state.get(following) == 1:
                cycles.append(" -> ".join([*path[path.index(following) :], following]))
            elif following not in state:
                visit(following, [*path, following])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_no_private_name_is_imported_from_another_subpackage():
    private = []
    for module, line, target, names in _edges():
        if group_of(module) == group_of(target):
            continue
        hidden = [n for n in names if n.startswith("_") and not n.startswith("__")]
        parts = target.split(".")[1:]
        if any(part.startswith("_") and not part.startswith("__") for part in parts):
            hidden.append(target)
        if hidden:
            where = MODULES[module].relative_to(ROOT.parent)
            private.append(f"{where}:{line} imports {', '.join(hidden)}")
    assert not private, "private names used across subpackages:\n" + "\n".join(private)


@pytest.mark.parametrize(
    ("module", "expected"),
    [
        ("bailing_knowledge.services.read", "bailing_knowledge.markdown"),
        ("bailing_knowledge.ingestion.pipeline", "bailing_knowledge.lookups"),
        ("bailing_knowledge.views", "bailing_knowledge.services"),
    ],
)
def test_the_walk_sees_relative_imports(module, expected):
    """The checks above are only as good as the resolution of `from ..x import y`."""
    assert expected in {target for _, target, _ in imports(module)}


def test_ingestion_steps_import_only_the_steps_below_them():
    package = f"{PACKAGE}.ingestion"
    steps = {f"{package}.{name}": index for index, name in enumerate(["", *INGESTION])}
    steps[package] = steps.pop(f"{package}.")
    unplaced = sorted(
        module for module in MODULES if module.startswith(f"{package}.") and module not in steps
    )
    assert not unplaced, f"give these a place in INGESTION in tests/test_layers.py: {unplaced}"
    upward = [
        f"{MODULES[module].relative_to(ROOT.parent)}:{line} imports {target}"
        for module in steps
        for line, target, _ in imports(module)
        if target in steps and steps[target] >= steps[module]
    ]
    assert not upward, "ingestion steps importing a later step:\n" + "\n".join(upward)
