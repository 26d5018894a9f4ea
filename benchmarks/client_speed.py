"""Benchmark: how fast the client answers (issue 37): ``collocate --help``, ``ls``, ``submit``,
``show`` and ``gpus`` against a running daemon on emulated GPUs, beside ``python -c pass`` (the
interpreter's own start), each as a fresh process, as a member types it. Target: a median of
at most 150 ms each.

The same commands run from a second source tree (``--baseline DIR``, e.g. ``git archive main
src | tar -x -C /tmp/main``) in the same run, interleaved with this tree's, so both see the
same load; the load average is recorded because other work on the machine inflates the times,
and each median is also given as a ratio to ``python -c pass`` timed in the same run. Each tree
is byte-compiled first, as ``pip install`` does: a session with ``PYTHONDONTWRITEBYTECODE`` set
would otherwise compile every module on every run (about 40 ms of ``ls``), which no member pays.

    python benchmarks/client_speed.py [--repeats 15] [--baseline /tmp/main/src] [--suffix b]

Writes benchmarks/results/client_speed-<UTC date><suffix>.md (and .json).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
sys.path.insert(0, str(HERE))

from _machine import machine  # noqa: E402

COMMANDS = {
    "python -c pass": None,
    "collocate --help": ["--help"],
    "collocate ls": ["ls"],
    "collocate submit": ["submit", "--mem", "1GiB", "--hold", "--", "true"],
    "collocate show 1": ["show", "1"],
    "collocate gpus": ["gpus"],
}


def _argv(args: list[str] | None) -> list[str]:
    if args is None:
        return [sys.executable, "-c", "pass"]
    return [sys.executable, "-c", "from collocate.cli import main; import sys; sys.argv[0] = 'collocate'; main()", *args]


def _time(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall, CPU) seconds of one run: the CPU time (user + system) is what a quiet machine's
    wall time comes close to; the wall time is what the member waited under this load."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False)
    took = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{argv[3:]} failed: {done.stderr.decode()[-500:]}")
    return took, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--baseline", type=Path, default=None, help="another tree's src/ to time beside this one")
    ap.add_argument("--label", default="main", help="the baseline's name in the table")
    ap.add_argument("--suffix", default="", help="after the date in the results' name: a second run that day")
    ns = ap.parse_args()
    trees = {"this branch": SRC, **({ns.label: ns.baseline.resolve()} if ns.baseline else {})}
    for src in trees.values():
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(src)], check=True, stdout=subprocess.DEVNULL)
    with tempfile.TemporaryDirectory(prefix="client-speed-") as tmp:
        state = Path(tmp) / "state"
        daemon = subprocess.Popen([sys.executable, "-m", "collocate.daemon", "serve", "--state-dir", str(state),
                                   "--gpus", "emulated:2xA100-40GB", "--sharing", "time-slicing"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                  env={**os.environ, "PYTHONPATH": str(SRC)})
        try:
            base_env = {k: v for k, v in os.environ.items() if not k.startswith("COLLOCATE_")}
            base_env["COLLOCATE_STATE_DIR"] = str(state)
            deadline = time.monotonic() + 60
            while not (state / "collocate.sock").exists():
                if time.monotonic() > deadline:
                    raise SystemExit("the daemon did not start")
                time.sleep(0.2)
            envs = {name: {**base_env, "PYTHONPATH": str(src)} for name, src in trees.items()}
            for env in envs.values():  # warm the page cache and the daemon, and make job 1
                for args in COMMANDS.values():
                    _time(_argv(args), env)
            load_before = os.getloadavg()
            times: dict[str, dict[str, list[tuple[float, float]]]] = (
                {t: {c: [] for c in COMMANDS} for t in trees})
            for _ in range(ns.repeats):  # interleaved: every command and tree sees the same load
                for command, args in COMMANDS.items():
                    for tree, env in envs.items():
                        times[tree][command].append(_time(_argv(args), env))
            load_after = os.getloadavg()
        finally:
            daemon.terminate()
            daemon.wait(30)
    medians = {t: {c: statistics.median(w for w, _ in v) * 1000 for c, v in per.items()} for t, per in times.items()}
    cpu = {t: {c: statistics.median(u for _, u in v) * 1000 for c, v in per.items()} for t, per in times.items()}
    info = {**machine(), "repeats": ns.repeats, "load_before": load_before, "load_after": load_after,
            "medians_ms": medians, "cpu_medians_ms": cpu, "times_s": times}
    out = HERE / "results" / f"client_speed-{dt.datetime.now(dt.UTC).date().isoformat()}{ns.suffix}"
    out.with_suffix(".json").write_text(json.dumps(info, indent=1) + "\n")
    names = list(trees)
    lines = [f"# Client speed, {info['date']}", "",
             f"{info['host_cpu']}, {info['cores']} cores, Python {info['python']}; load average "
             f"{load_before[0]:.1f} before and {load_after[0]:.1f} after (1 min). Median of "
             f"{ns.repeats} fresh processes each, interleaved, against a daemon on 2 emulated "
             "A100s (`benchmarks/client_speed.py`). Target: 150 ms.", "",
             "| command | " + " | ".join(f"{n}: wall (ms) | {n}: CPU (ms) | {n}: wall / `python -c pass` "
                                         f"| {n}: CPU / `python -c pass`" for n in names) + " |",
             "| --- |" + " ---: | ---: | ---: | ---: |" * len(names)]
    for command in COMMANDS:
        lines.append(f"| `{command}` | " + " | ".join(
            f"{medians[n][command]:.0f} | {cpu[n][command]:.0f} | "
            f"{medians[n][command] / medians[n]['python -c pass']:.1f}x | "
            f"{cpu[n][command] / cpu[n]['python -c pass']:.1f}x" for n in names) + " |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
