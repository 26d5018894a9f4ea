"""The package's layers, checked on its source: each package of ``src/collocate`` may import its
own modules and the packages of lower layers, never a higher layer's or a peer's (two packages
of one layer know nothing of each other). Every import counts, at module level or inside a
function (a lazy import is still a dependency), and the packages' import graph has no cycle.

The table is the one ``docs/architecture.md`` shows. To add a package, give it a row or a place
in one; a package that needs a higher one is in the wrong layer, or the code it needs is.
"""

from __future__ import annotations

import ast
import functools
import graphlib
from collections.abc import Iterator
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

#: Lowest first. ``collocate`` is the package root (``__init__.py``: the version).
LAYERS: list[tuple[str, ...]] = [
    ("collocate",),  # the package root: its version
    ("common",),  # errors, units, safe text, SQLite, TLS, plots, how commands are declared
    ("core",),  # the scheduling core both worlds drive: model, policies, scheduler, world, rules
    ("gpus", "share", "workloads"),  # GPU backends; shared data loading; the bench's models
    ("monitor",),  # sampling, attribution, sinks, the metrics jobs log
    ("node",),  # what one machine does with a job: runners, cgroups, logs, the emulated job
    ("wire",),  # what the client and the daemon both speak: protocol, schema, rights, paths, spec
    ("estimate",),  # the memory estimator (its warm server admits peers by wire's rule)
    ("client",),  # the client commands and the Client
    ("web",),  # the dashboard app, over the client or the daemon's source
    ("cluster",),  # several nodes over Ray
    ("daemon", "sim"),  # the two worlds
    ("bench",),  # the harness: runs the daemon and the simulator
    ("cli",),  # the root command table, the Typer app, commands that compose areas
]
RANK = {package: rank for rank, row in enumerate(LAYERS) for package in row}


def package_of(module: str) -> str:
    """``collocate.core.world`` -> ``core``; ``collocate`` -> ``collocate``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def module_name(path: Path, src: Path) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, src: Path) -> Iterator[tuple[str, int]]:
    """Every ``collocate`` module or package ``path`` imports, anywhere in it, with the line."""
    module = module_name(path, src)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from ((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target == "collocate":  # from collocate import core: the package named
                for alias in node.names:
                    named = src / "collocate" / alias.name
                    inner = named.is_dir() or named.with_suffix(".py").exists()
                    yield (f"collocate.{alias.name}" if inner else "collocate"), node.lineno
            else:
                yield target, node.lineno


def edges(src: Path) -> list[tuple[str, str, str]]:
    """(importing package, imported package, where) for every import across packages."""
    found = []
    for path in sorted((src / "collocate").rglob("*.py")):
        source = package_of(module_name(path, src))
        for target, line in imports(path, src):
            if target.split(".")[0] != "collocate":
                continue
            imported = package_of(target)
            if imported != source:
                found.append((source, imported, f"{path.relative_to(src)}:{line}"))
    return found


def against_layers(found: list[tuple[str, str, str]]) -> list[str]:
    """Each import of a higher layer's package or a peer's, said with where it is."""
    wrong = []
    for source, imported, where in found:
        if source not in RANK or imported not in RANK:
            continue  # unplaced: test_every_package_has_a_layer says so
        if RANK[imported] > RANK[source]:
            wrong.append(f"{where}: {source} (layer {RANK[source]}) imports {imported}, a higher layer ({RANK[imported]})")
        elif RANK[imported] == RANK[source]:
            wrong.append(f"{where}: {source} imports {imported}, a peer in its layer")
    return wrong


def cycle(found: list[tuple[str, str, str]]) -> list[str] | None:
    graph: dict[str, set[str]] = {}
    for source, imported, _ in found:
        graph.setdefault(source, set()).add(imported)
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as exc:
        return list(reversed(exc.args[1]))  # graphlib lists predecessors: turn it into "imports"
    return None


def packages(src: Path) -> set[str]:
    root = src / "collocate"
    flat = {p.stem for p in root.glob("*.py") if p.name != "__init__.py"}
    return flat | {p.parent.name for p in root.glob("*/__init__.py")} | {"collocate"}


def test_every_package_has_a_layer():
    """A flat module or a new package with no row would escape every other check."""
    unplaced = sorted(packages(SRC) - set(RANK))
    assert not unplaced, (f"no layer for {unplaced} in src/collocate: move a flat module into the package "
                          "of its layer, or give a new package a row in LAYERS (and docs/architecture.md)")
    assert not set(RANK) - packages(SRC), "LAYERS names a package that is gone"


@functools.cache
def source_edges() -> list[tuple[str, str, str]]:
    return edges(SRC)


def test_no_import_against_the_layers():
    wrong = against_layers(source_edges())
    assert not wrong, "imports against the layers (LAYERS in tests/test_layers.py):\n" + "\n".join(wrong)


def test_no_cycle_between_packages():
    found = cycle(source_edges())
    assert found is None, f"packages import each other in a cycle: {' -> '.join(found)}"


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


@pytest.mark.parametrize("bad", [
    "from collocate.daemon import store\n",  # module level
    "def f():\n    from collocate.daemon.store import Store\n",  # inside a function
    "def f():\n    from ..daemon import store\n",  # relative
    "import collocate.daemon.store\n",
    "from collocate import daemon\n",
])
def test_an_upward_import_is_caught_however_written(tmp_path, bad):
    """The checks themselves: the core importing the daemon, each way an import can be written."""
    src = _tree(tmp_path, {"collocate/__init__.py": "", "collocate/core/__init__.py": "",
                           "collocate/core/world.py": bad, "collocate/daemon/__init__.py": "",
                           "collocate/daemon/store.py": "from collocate.core import world\n"})
    found = edges(src)
    assert [w.split(":")[0] for w in against_layers(found)] == ["collocate/core/world.py"]
    assert set(cycle(found) or ()) == {"core", "daemon"}


def test_downward_imports_pass(tmp_path):
    src = _tree(tmp_path, {"collocate/__init__.py": "", "collocate/core/__init__.py": "",
                           "collocate/core/world.py": "from ..common.errors import InputError\n",
                           "collocate/common/__init__.py": "", "collocate/common/errors.py": "import collocate\n",
                           "collocate/daemon/__init__.py": "",
                           "collocate/daemon/store.py": "def f():\n    from collocate.core import world\n"})
    found = edges(src)
    assert {(s, i) for s, i, _ in found} == {("core", "common"), ("common", "collocate"), ("daemon", "core")}
    assert against_layers(found) == [] and cycle(found) is None


def test_peers_in_a_layer_may_not_import_each_other(tmp_path):
    src = _tree(tmp_path, {"collocate/sim/__init__.py": "import collocate.daemon\n",
                           "collocate/daemon/__init__.py": ""})
    assert len(against_layers(edges(src))) == 1
