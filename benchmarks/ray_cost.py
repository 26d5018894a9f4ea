"""What Ray costs a collocate site: install size and time, a 3-node cluster's memory, start time
and idle CPU.

    python benchmarks/ray_cost.py [--ray-version 2.60.0] [--idle-seconds 60] [--venv DIR]

Install: a fresh venv (``--venv``, default a temporary directory) gets ``pip install
ray==<version>``, and after the cluster below ``ray[default]==<version>`` (the dashboard's
extra), each timed, and the venv's size measured before and after each (pip's wheel cache is used
as configured; the result says whether pip reported cached files). Cluster: with that venv's
plain ``ray``, ``ray start --head``
then two workers joining it, one after another (concurrent worker starts timed out on this
machine), each ``--num-cpus=1 --resources '{"collocate": 1}'``, token authentication on
(``RAY_AUTH_MODE=token``), no dashboard, every port chosen free so other Ray clusters on the
machine are untouched. Every process the cluster starts inherits a marker variable; RSS and PSS
are summed over those processes once the cluster is up, and their CPU time (user + sys) over
``--idle-seconds`` with nothing submitted. The cluster is stopped by killing exactly those pids
(never ``ray stop``, which would stop every Ray cluster on the machine).

Writes benchmarks/results/ray_cost-<date>.json and .md.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).parent))

from _machine import machine

MARK = "COLLOCATE_RAY_COST_MARK"
RESULTS = Path(__file__).parent / "results"


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def timed_pip(venv: Path, requirement: str) -> dict:
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--progress-bar", "off", requirement]
    before = dir_bytes(venv)
    start = time.monotonic()
    done = subprocess.run(pip, capture_output=True, text=True, check=False)
    seconds = time.monotonic() - start
    if done.returncode != 0:
        raise SystemExit(f"pip install {requirement} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    lines = done.stdout.splitlines()
    return {
        "requirement": requirement,
        "seconds": round(seconds, 1),
        "added_mb": round((dir_bytes(venv) - before) / 1e6, 1),
        "packages_installed": next((ln.split("Successfully installed ", 1)[1].split() for ln in lines
                                    if ln.startswith("Successfully installed")), []),
        "used_pip_cache": any("Using cached" in ln for ln in lines),
    }


def install(venv: Path, version: str) -> dict:
    start = time.monotonic()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    venv_seconds = time.monotonic() - start
    empty_mb = dir_bytes(venv) / 1e6
    config = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "config", "list"], capture_output=True,
                            text=True, check=False).stdout.split()
    sources = [c.split("=", 1)[1].strip("'") for c in config if "index" in c or "find-links" in c]
    return {"venv_seconds": round(venv_seconds, 1), "empty_venv_mb": round(empty_mb, 1),
            # only local sources (a wheel folder, file:// indexes): the times include no download
            "pip_local_sources_only": bool(sources) and all(s.startswith(("/", "file://")) for s in sources),
            "ray": timed_pip(venv, f"ray=={version}")}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def marked(mark: str) -> list[psutil.Process]:
    """The processes whose environment holds the marker. Read raw: Ray's process titles
    (``ray::DashboardAgent``...) overwrite the start of the environment block, after which
    ``psutil.Process.environ()`` returns nothing."""
    needle = f"{MARK}={mark}".encode()
    out = []
    for proc in psutil.process_iter():
        try:
            with open(f"/proc/{proc.pid}/environ", "rb") as handle:
                if needle in handle.read().split(b"\0"):
                    out.append(proc)
        except OSError:
            continue
    return out


def memory(procs: list[psutil.Process]) -> dict:
    rss = pss = 0
    names: dict[str, int] = {}
    for proc in procs:
        try:
            full = proc.memory_full_info()
            name = proc.name()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        rss, pss = rss + full.rss, pss + full.pss
        names[name] = names.get(name, 0) + 1
    return {"processes": sum(names.values()), "rss_mib": round(rss / 2**20), "pss_mib": round(pss / 2**20),
            "by_name": dict(sorted(names.items()))}


def cpu_seconds(procs: list[psutil.Process]) -> dict[int, float]:
    out = {}
    for proc in procs:
        try:
            t = proc.cpu_times()
            out[proc.pid] = t.user + t.system
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return out


def ray_start(ray: Path, env: dict, *args: str) -> float:
    start = time.monotonic()
    done = subprocess.run([str(ray), "start", *args], env=env, capture_output=True, text=True, check=False,
                          timeout=180)
    if done.returncode != 0:
        raise SystemExit(f"ray start {' '.join(args)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return time.monotonic() - start


def node_ports() -> list[str]:
    return [f"--dashboard-agent-listen-port={free_port()}", f"--metrics-export-port={free_port()}"]


def cluster(ray: Path, workdir: Path, idle_seconds: float) -> dict:
    mark = secrets.token_hex(8)
    home = workdir / "home"  # the token and Ray's files stay out of the real ~/.ray
    home.mkdir(parents=True, exist_ok=True)
    token = secrets.token_hex(32)
    env = {**os.environ, MARK: mark, "HOME": str(home), "RAY_TMPDIR": str(workdir / "ray-tmp"),
           "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token, "RAY_USAGE_STATS_ENABLED": "0"}
    port = free_port()
    common = ["--num-cpus=1", '--resources={"collocate": 1}', "--disable-usage-stats"]
    t0 = time.monotonic()
    try:
        head = ray_start(ray, env, "--head", f"--port={port}", "--include-dashboard=false", *node_ports(), *common)
        workers = [ray_start(ray, env, f"--address=127.0.0.1:{port}", *node_ports(), *common) for _ in range(2)]
        total = time.monotonic() - t0
        nodes = cluster_nodes(ray, env, port)
        time.sleep(5)  # let start-up work (worker prestart, first reports) finish before measuring
        procs = marked(mark)
        mem = memory(procs)
        first = cpu_seconds(procs)
        time.sleep(idle_seconds)
        procs_after = marked(mark)
        last = cpu_seconds(procs_after)
        spent = sum(last[p] - first.get(p, 0.0) for p in last)
        return {
            "start_seconds": {"head": round(head, 1), "workers": [round(w, 1) for w in workers],
                              "total": round(total, 1)},
            "alive_nodes": nodes,
            "memory": mem,
            "idle": {"seconds": idle_seconds, "cpu_seconds": round(spent, 2),
                     "percent_of_one_core": round(100 * spent / idle_seconds, 1),
                     "processes_after": len(procs_after)},
        }
    finally:
        stop(mark)


def cluster_nodes(ray: Path, env: dict, port: int) -> int:
    python = ray.parent / "python"
    code = ("import ray; ray.init(address='127.0.0.1:%d', logging_level='ERROR'); "
            "print(sum(1 for n in ray.nodes() if n['Alive']))" % port)
    done = subprocess.run([str(python), "-c", code], env=env, capture_output=True, text=True, timeout=120, check=False)
    return int(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else -1


def stop(mark: str) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        procs = marked(mark)
        for proc in procs:
            try:
                proc.send_signal(sig)
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(procs, timeout=10)


def write(result: dict) -> Path:
    RESULTS.mkdir(exist_ok=True)
    stem = RESULTS / f"ray_cost-{result['machine']['date']}"
    stem.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    m, c = result["machine"], result["cluster"]
    lines = [f"# What Ray costs ({m['date']}, {m['host_cpu']}, {m['cores']} cores, Python {m['python']}, no GPU)", ""]
    if "install" in result:
        i = result["install"]
        lines += ["| install into a fresh venv | seconds | MB added | pip cache used |", "| --- | --- | --- | --- |"]
        for key in ("ray", "ray_default_extra"):
            r = i[key]
            lines.append(f"| `pip install {r['requirement']}` | {r['seconds']} | {r['added_mb']} | {r['used_pip_cache']} |")
        lines += ["", "pip read wheels from local sources only (a wheel folder and file:// indexes): no download time "
                  "is included." if i["pip_local_sources_only"] else "pip downloaded from its configured indexes.", ""]
    s, mem, idle = c["start_seconds"], c["memory"], c["idle"]
    lines += [
        f"Cluster: `ray {result['ray_version']}`, head + 2 workers started one after another on this machine, "
        f"each `--num-cpus=1 --resources '{{\"collocate\": 1}}'`, `RAY_AUTH_MODE=token`, no dashboard; "
        f"{c['alive_nodes']} nodes alive.", "",
        "| metric | value |", "| --- | --- |",
        f"| head start | {s['head']} s |",
        f"| worker starts | {', '.join(f'{w} s' for w in s['workers'])} |",
        f"| 3 nodes up (total) | {s['total']} s |",
        f"| processes | {mem['processes']} ({', '.join(f'{k} {v}' for k, v in mem['by_name'].items())}) |",
        f"| RSS sum | {mem['rss_mib']} MiB |",
        f"| PSS sum (shared pages counted once) | {mem['pss_mib']} MiB |",
        f"| idle CPU over {idle['seconds']:g} s | {idle['cpu_seconds']} CPU s = {idle['percent_of_one_core']} % of one core |",
        "",
        "The machine was shared with other work while this ran, so times are upper bounds.",
    ]
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    return stem


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ray-version", default="2.60.0")
    parser.add_argument("--idle-seconds", type=float, default=60.0)
    parser.add_argument("--venv", type=Path, help="where to make the fresh venv (must not exist)")
    parser.add_argument("--skip-install", action="store_true", help="use the ray of --venv as it is")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="ray-cost-"))
    venv = args.venv or workdir / "venv"
    result: dict = {"machine": machine(), "ray_version": args.ray_version}
    try:
        if not args.skip_install:
            if venv.exists():
                raise SystemExit(f"{venv} exists: give a new path to --venv, or --skip-install to reuse it")
            result["install"] = install(venv, args.ray_version)
        result["cluster"] = cluster(venv / "bin" / "ray", workdir, args.idle_seconds)  # plain ray only
        if not args.skip_install:  # the dashboard's extra, after: the cluster above runs without it
            result["install"]["ray_default_extra"] = timed_pip(venv, f"ray[default]=={args.ray_version}")
            print(json.dumps(result["install"], indent=2), flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(result["cluster"], indent=2))
    print(f"wrote {write(result)}.json/.md")


if __name__ == "__main__":
    main()
