"""``collocate serve`` keeps a warm estimator by default where torch is installed (the tests'
daemons opt out, ``tests/conftest.py``): it answers `collocate estimate`, found without options
(the same output as ``--cold``, from a command that never imports torch), and it goes away with
the daemon, even a SIGKILLed one, taking its socket with it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

from daemon_harness import wait_for

READY_TIMEOUT_S = 240.0  # it imports torch and traces two small models: slow on a loaded machine


def estimate(state: Path, *extra: str) -> tuple[str, bool]:
    """`collocate estimate` of a small MLP: its output, and whether the command imported torch
    (``-X importtime``'s list; peak RSS would not do: a child's counts its parent's at fork)."""
    argv = [str(Path(sys.executable).with_name("collocate")), "estimate", "collocate.workloads.models:build_mlp",
            "--batch-size", "8", "--gpu", "A100-40GB", "--format", "json", *extra]
    env = {k: v for k, v in os.environ.items() if k != "COLLOCATE_STATE_DIR"}
    # no option: the per-user default state dir, as a member's shell has it (and no lab daemon)
    env |= {"XDG_STATE_HOME": str(state.parent), "COLLOCATE_LAB_STATE_DIR": str(state / "no-lab"),
            "PYTHONPROFILEIMPORTTIME": "1"}
    assert state.name == "collocate"
    out = subprocess.run(argv, capture_output=True, text=True, env=env, check=True, timeout=600)
    imported = {line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines() if line.startswith("import time:")}
    return out.stdout, "torch" in imported


def test_the_default_daemons_warm_estimator_answers_and_dies_with_it(daemons, monkeypatch) -> None:
    monkeypatch.delenv("COLLOCATE_NO_WARM_ESTIMATOR")  # as a user starts it: neither flag nor variable
    d = daemons(name="collocate")
    sock = d.state_dir / "estimator.sock"
    wait_for(lambda: "a warm estimator for `collocate estimate` is starting" in d.read_log(), 30,
             "serve to say what its warm estimator costs")
    wait_for(sock.exists, READY_TIMEOUT_S, "the warm estimator to listen")
    (warm_pid,) = (int(p) for p in Path(f"/proc/{d.proc.pid}/task/{d.proc.pid}/children").read_text().split()
                   if "collocate.estimate.warm" in Path(f"/proc/{p}/cmdline").read_text())
    warm_out, warm_torch = estimate(d.state_dir)
    cold_out, cold_torch = estimate(d.state_dir, "--cold")
    assert warm_out == cold_out
    assert '"method": "traced"' in warm_out
    assert cold_torch and not warm_torch
    d.kill(signal.SIGKILL)
    wait_for(lambda: not Path(f"/proc/{warm_pid}").exists() or _zombie(warm_pid), 15,
             "the warm estimator to stop with its daemon")
    assert not sock.exists()


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_a_daemon_without_one_removes_an_earlier_runs_socket(daemons, tmp_path, monkeypatch) -> None:
    """A socket left by a SIGKILLed warm estimator would make every estimate try it first."""
    monkeypatch.delenv("COLLOCATE_NO_WARM_ESTIMATOR")  # the flag alone turns it off
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    stale = state / "estimator.sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(stale))
    d = daemons("--no-warm-estimator")
    assert d.state_dir == state
    assert not stale.exists()
