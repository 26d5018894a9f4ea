"""The lint and type gate: ruff must report nothing on the whole package, and mypy nothing on the
scheduling core and the policies, nor on the daemon, the node seam, the cluster head and the
client commands; both configured in pyproject.toml and pinned in the ``dev`` extra."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CORE = [
    "src/collocate/model.py",
    "src/collocate/scheduler.py",
    "src/collocate/fairness.py",
    "src/collocate/recovery.py",
    "src/collocate/interference.py",
    "src/collocate/world.py",
    "src/collocate/belief.py",
    "src/collocate/identity.py",
    "src/collocate/commitment.py",
    "src/collocate/knowledge.py",
    "src/collocate/suspension.py",
    "src/collocate/preemption.py",
    "src/collocate/policies",
    "src/collocate/sim/engine.py",
    "src/collocate/sim/devices.py",
    "src/collocate/sim/mig.py",
]
#: The daemon and what it talks to through typed seams: the ``Node`` API and its nodes (local, Ray
#: agents), and the client commands.
SERVICE = [
    "src/collocate/daemon",
    "src/collocate/node",
    "src/collocate/cluster",
    "src/collocate/client",
]


def _run(tool: str, *args: str, paths: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
    if importlib.util.find_spec(tool) is None:
        pytest.fail(f"{tool} is not installed: pip install -e '.[dev]' (it is pinned there)")
    return subprocess.run([sys.executable, "-m", tool, *args, *paths], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout, check=False)


def test_ruff_finds_nothing_in_the_package():
    out = _run("ruff", "check", "--no-cache", paths=["src/collocate"])
    assert out.returncode == 0, out.stdout + out.stderr


def test_mypy_finds_nothing_in_the_core_nor_in_the_daemon_and_the_node_code():
    """One mypy run over both sets: the service imports the core, so a run of its own for the core
    analysed the same modules (and the standard library's stubs) a second time, cold in a fresh
    clone. The time limit is a hang guard for a loaded machine (a cold run is about a minute of
    CPU), not a budget."""
    out = _run("mypy", "--cache-dir", str(REPO / ".mypy_cache"), paths=[*CORE, *SERVICE], timeout=900)
    assert out.returncode == 0, out.stdout + out.stderr
