"""The lint and type gate: ruff (package, tests, benchmarks) and mypy (package) must report nothing, both configured
in pyproject.toml and pinned in the ``dev`` extra."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = "src/collocate"


def _run(tool: str, *args: str, paths: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
    if importlib.util.find_spec(tool) is None:
        pytest.fail(f"{tool} is not installed: pip install -e '.[dev]' (it is pinned there)")
    return subprocess.run([sys.executable, "-m", tool, *args, *paths], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout, check=False)


def test_ruff_finds_nothing_in_the_package_its_tests_and_benchmarks():
    out = _run("ruff", "check", "--no-cache", paths=[PACKAGE, "tests", "benchmarks"])
    assert out.returncode == 0, out.stdout + out.stderr


def test_mypy_finds_nothing_in_the_package():
    """The time limit is a hang guard for a loaded machine (a cold run, as in a fresh clone, is
    about 65 s of CPU and 0.5 GB; a warm one about 11 s), not a budget."""
    out = _run("mypy", "--cache-dir", str(REPO / ".mypy_cache"), paths=[PACKAGE], timeout=900)
    assert out.returncode == 0, out.stdout + out.stderr
