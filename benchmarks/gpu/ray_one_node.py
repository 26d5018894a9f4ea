"""Issue 20 on a real GPU: the agent's NVML path as a one-node Ray cluster.

    python benchmarks/gpu/ray_one_node.py --out DIR [--dry-run]

1. ``ray start --head --num-gpus=0 --resources '{"collocate": 1}' --labels=collocate-node=gpu0``
   (docs/multi-node.md's flags) with token authentication
   (``RAY_AUTH_MODE=token``, a fresh token in ``RAY_AUTH_TOKEN``), no dashboard, private
   ``HOME`` and ``RAY_TMPDIR``;
2. ``collocate serve --ray auto --gpus nvml`` (the head; its agent on this node owns NVML);
3. two short real training jobs (``first_run_job.py``, plain PyTorch: an MLP and an LSTM)
   submitted at once;
4. checks that both ended ``done``, ran on a real GPU (a ``GPU-``/``MIG-`` UUID the agent's NVML
   backend listed, not an emulated one) and that NVML measured them (an attempt's ``peak_mib``
   above zero, the GPU's ``used_mib`` read while they ran).

With ``--torchrun`` (round E2, issue 32) the job is instead one ``submit --nodes 1 --gpus 1``
torchrun job (``torchrun_allreduce.py``: an all-reduce over NCCL, gloo in a dry run) through the
same path, the multi-node launch path with one part; checks it ended ``done`` and printed the
all-reduce's result.

Needs h-ray's ``collocate serve --ray`` (the lead merges it with this) and Ray on the device:
``bash benchmarks/gpu/fetch_wheels.sh`` fills ``.whl-ray``, which the call carries. ``--dry-run``
does the same plumbing on a CPU machine with ``--gpus emulated:1xH100-80GB`` and tiny models,
and skips the real-GPU checks. Writes ``DIR/summary.json`` (checks, the ``gpus`` rows seen,
each job's ``show``), ``DIR/daemon.log`` and ``DIR/ray.log``. Exits 1 when a check failed.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from collocate.daemon.child import DaemonProcess

HERE = Path(__file__).resolve().parent
MARK = "COLLOCATE_RAY_ONE_NODE"
JOBS = {False: [("mlp", 1024, 400), ("lstm", 64, 200)], True: [("mlp-tiny", 16, 20), ("unet-tiny", 2, 5)]}
TERMINAL = ("done", "failed", "cancelled", "rejected")


def ray_cli(*args: str) -> list[str]:
    """The ``ray`` command through this interpreter (carried wheels install no console script)."""
    return [sys.executable, "-c", "import sys; from ray.scripts.scripts import main; sys.exit(main())", *args]


def start_ray(env: dict[str, str], log: Path) -> str:
    port = 6390
    with open(log, "ab") as out:
        subprocess.run(ray_cli("start", "--head", f"--port={port}", "--num-cpus=4", "--num-gpus=0",
                               '--resources={"collocate": 1}', "--labels=collocate-node=gpu0",
                               "--include-dashboard=false", "--disable-usage-stats"),
                       env=env, stdout=out, stderr=subprocess.STDOUT, check=True, timeout=180)
    return f"127.0.0.1:{port}"


def stop_marked(mark: str) -> None:
    """Kill the Ray processes this run started (they carry its marker), by pid. The environment
    is read raw: Ray's process titles overwrite its start, where psutil then sees nothing."""
    needle = f"{MARK}={mark}".encode()
    for sig in (signal.SIGTERM, signal.SIGKILL):
        procs = []
        for proc in psutil.process_iter():
            try:
                with open(f"/proc/{proc.pid}/environ", "rb") as handle:
                    if needle in handle.read().split(b"\0"):
                        proc.send_signal(sig)
                        procs.append(proc)
            except (OSError, psutil.NoSuchProcess):
                continue
        psutil.wait_procs(procs, timeout=10)


def submit(daemon: DaemonProcess, env: dict[str, str], model: str, batch: int, steps: int, workdir: Path) -> str:
    if model.startswith("torchrun"):  # round E2: one part, through the multi-node launch path
        backend = model.split("-")[1]
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1",
                   str(HERE / "torchrun_allreduce.py"), "--backend", backend]
        argv = [sys.executable, "-m", "collocate.cli", "submit", "--state-dir", str(daemon.state_dir),
                "--name", model, "--nodes", "1", "--gpus", "1", "--cwd", str(workdir), "--", *command]
    else:
        argv = [sys.executable, "-m", "collocate.cli", "submit", "--state-dir", str(daemon.state_dir), "--name", model,
                "--cwd", str(workdir), "--", sys.executable, str(HERE / "first_run_job.py"), "--model", model,
                "--batch-size", str(batch), "--steps", str(steps), "--lr", "1e-3"]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        raise SystemExit(f"collocate submit {model} exited {done.returncode}: {done.stderr.strip()}")
    return done.stdout.strip().splitlines()[-1]


def run(out: Path, dry: bool, timeout_s: float, torchrun: bool = False) -> dict:
    mark = secrets.token_hex(8)
    scratch = Path(tempfile.mkdtemp(prefix="r1n-"))  # short: the API socket lives here
    (scratch / "home").mkdir()
    env = {**os.environ, MARK: mark, "HOME": str(scratch / "home"), "RAY_TMPDIR": str(scratch / "ray"),
           "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32), "RAY_USAGE_STATS_ENABLED": "0"}
    gpus = "emulated:1xH100-80GB" if dry else "nvml"
    result: dict = {"dry_run": dry, "gpus": gpus, "checks": {}, "gpu_rows": [], "jobs": []}
    daemon = None
    try:
        t0 = time.monotonic()
        address = start_ray(env, out / "ray.log")
        result["ray_start_s"] = round(time.monotonic() - t0, 1)
        os.environ.update({k: env[k] for k in (MARK, "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_TMPDIR")})
        daemon = DaemonProcess(scratch / "state", ["--ray", "auto", "--gpus", gpus, "--period", "1", "--verbose"],
                               out / "daemon.log", name="the collocate head", client_timeout_s=30)
        daemon.wait_ready(timeout_s=120)
        result["head_ready_s"] = round(time.monotonic() - t0, 1)
        jobs = [(f"torchrun-{'gloo' if dry else 'nccl'}", 0, 0)] if torchrun else JOBS[dry]
        ids = [submit(daemon, env, *job, workdir=scratch) for job in jobs]
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            rows = daemon.client.request("gpus")
            if any(r.get("jobs") for r in rows):
                result["gpu_rows"].append({"t": round(time.monotonic() - t0, 1), "rows": rows})
            if all(daemon.client.request("show", id=i)["state"] in TERMINAL for i in ids):
                break
            time.sleep(1)
        result["jobs"] = [daemon.client.request("show", id=i) for i in ids]
        result["stdout"] = [daemon.client.request("logs", id=i, offset=0)["text"] for i in ids]
        result["torchrun"] = torchrun
        result["address"] = address
    finally:
        if daemon is not None:
            for job in result["jobs"] or []:
                if job["state"] not in TERMINAL:
                    daemon.client.request("cancel", id=job["id"])
            daemon.stop()
        stop_marked(mark)
        shutil.rmtree(scratch, ignore_errors=True)
    result["checks"] = checks(result, dry)
    return result


def checks(result: dict, dry: bool) -> dict[str, bool]:
    jobs = result["jobs"]
    if result.get("torchrun"):
        backend = "gloo" if dry else "nccl"
        out = {"the torchrun job ended done": len(jobs) == 1 and jobs[0]["state"] == "done",
               f"its all-reduce over {backend} gave 1 on a world of 1": any(
                   f"all_reduce 1 world 1 backend {backend}" in text for text in result.get("stdout", []))}
        if not dry:
            uuids = {u for j in jobs for a in j["attempts"] for u in a["uuids"]}
            out["ran on a real GPU (GPU-/MIG- UUID, not emulated)"] = bool(uuids) and all(
                u.startswith(("GPU-", "MIG-")) and "emu" not in u for u in uuids)
        return out
    attempts = [a for j in jobs for a in j["attempts"]]
    uuids = {u for a in attempts for u in a["uuids"]}
    seen_uuids = {r["uuid"] for snap in result["gpu_rows"] for r in snap["rows"]}
    out = {"both jobs done": len(jobs) == 2 and all(j["state"] == "done" for j in jobs),
           "the GPUs seen were listed by the agent's backend": bool(uuids) and uuids <= seen_uuids}
    if not dry:
        out["ran on a real GPU (GPU-/MIG- UUID, not emulated)"] = bool(uuids) and all(
            u.startswith(("GPU-", "MIG-")) and "emu" not in u for u in uuids)
        out["NVML measured each job's peak memory"] = bool(attempts) and all((a.get("peak_mib") or 0) > 0
                                                                             for a in attempts)
        out["NVML read GPU memory in use while they ran"] = any(
            (r.get("used_mib") or 0) > 0 for snap in result["gpu_rows"] for r in snap["rows"])
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--dry-run", action="store_true", help="emulated GPU, tiny models: the plumbing on a CPU")
    parser.add_argument("--timeout-s", type=float, default=240.0, help="how long the two jobs may take")
    parser.add_argument("--torchrun", action="store_true", help="round E2: one --nodes 1 torchrun "
                        "job with an NCCL all-reduce (gloo in a dry run) instead of the two jobs")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    result = run(args.out, args.dry_run, args.timeout_s, args.torchrun)
    (args.out / "summary.json").write_text(json.dumps(result, indent=1) + "\n")
    for name, ok in result["checks"].items():
        print(f"{'ok  ' if ok else 'FAIL'} {name}")
    return 0 if all(result["checks"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
