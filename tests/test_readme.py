"""The README's "Using it" block, run as written: a daemon on emulated GPUs, the example training
jobs (a sweep and an --after job), report, simulate and estimate, so the README cannot rot.

Three things differ from a person's shell, each checked: the test's own virtual environment
stands in for ``source .venv/bin/activate`` and ``pip install`` (it already has ``.[dev]``), a
free port stands in for the dashboard's, and the state directory is a temporary one
(``COLLOCATE_STATE_DIR``). It runs in a temporary folder beside a link to ``examples/``.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PORT = "8377"


def using_it_block() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Using it", 1)[1]
    block = re.search(r"```\n(.*?)```", section, re.S)
    assert block, "no code block under 'Using it'"
    return block.group(1).strip().splitlines()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_the_readme_using_it_block_runs_as_written(tmp_path: Path) -> None:
    lines = using_it_block()
    assert lines[0] == "source .venv/bin/activate" and lines[1].startswith("pip install -e ")
    assert any(PORT in line for line in lines), "the dashboard port changed: update PORT"
    script = ["set -euo pipefail", "trap 'kill $(jobs -p) 2>/dev/null || true' EXIT"]
    for line in lines[2:]:
        script.append(line.replace(PORT, str(_free_port())))
        if line.startswith("collocate serve"):  # a loaded machine may need longer than a person
            script.append("for i in $(seq 300); do collocate ls >/dev/null 2>&1 && break; sleep 0.2; done")
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
           "COLLOCATE_STATE_DIR": str(tmp_path / "state"), "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.Popen(["bash", "-c", "\n".join(script)], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, out[-4000:]
    assert re.search(r"runs/first\.pt: accuracy \d", out), out[-3000:]  # job 6 ran after job 1
    assert "1 done" in out and "6 done" in out
    summary = (tmp_path / "report" / "summary.md").read_text()
    assert re.search(r"\| 1 \| \S+ \| train\.py \| done \| 0 \|", summary), summary  # sacct's fields
    assert "No job was seen holding GPU memory" in summary  # the CPU jobs: said, not a table of zeros
    assert "carma-magm" in out and "auto" in out  # the simulator's table
    assert "method: traced" in out  # the estimate
