"""Fault injection: a real daemon whose daemon, runners and jobs are SIGKILLed at random moments,
with concurrent clients and (as root) a disk that fills up; counts jobs lost, run twice or
recorded wrongly.

    python benchmarks/fault_injection.py [--rounds 200] [--jobs 6] [--clients 3] [--seed 1]

Each round: ``--clients`` threads submit ``--jobs`` short shell jobs between them (through
``Client``, which retries with an idempotency key), while one fault is injected at a random
moment: SIGKILL of the daemon (restarted at once), of a running job's runner, or of a job's own
process; or (as root, on a tmpfs state dir) the disk filled for a second. Then the round waits
until its jobs have ended and checks each against the truth the jobs wrote themselves (an
append-only ledger outside the state dir: ``start ID`` when a job starts, ``end ID CODE`` just
before it exits with CODE):

* **lost**: a submit that was acknowledged whose job the daemon does not list, or that never
  ended (submits the client gave up on are counted apart, with whether they were stored);
* **run twice**: more than one ``start`` line for a job, or two jobs for one submission;
* **recorded wrongly**: the daemon's final state differs from the truth (``done`` iff the job
  wrote ``end ID 0``; a job we SIGKILLed must be ``failed``).

Faults are single per round: a round's jobs end before the next fault (the double fault of a
runner *and* the daemon killed while a job runs leaves its status unknowable; see
docs/security.md). Writes benchmarks/results/fault_injection-<date>.json and .md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from _machine import machine

from collocate.daemon.client import Client
from collocate.errors import CollocateError

GPUS = "emulated:2xA100-40GB"
FAULTS = ("daemon", "runner", "job", "disk")


class Daemon:
    def __init__(self, state: Path, log: Path) -> None:
        self.state, self.log_path = state, log
        self.proc: subprocess.Popen | None = None
        self.client = Client(state, timeout_s=60)

    def start(self) -> None:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "collocate.daemon", "serve", "--state-dir", str(self.state),
                 "--gpus", GPUS, "--period", "0.2"], stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"the daemon exited with {self.proc.returncode}; see {self.log_path}")
            try:
                Client(self.state, timeout_s=5).request("ping")
                return
            except CollocateError:
                time.sleep(0.1)
        raise SystemExit("the daemon did not answer in 60 s")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()


def job_command(ledger: Path, seconds: float, code: int) -> list[str]:
    return ["/bin/sh", "-c", f'echo "start $COLLOCATE_JOB_ID" >> {ledger}; sleep {seconds:.2f}; '
            f'echo "end $COLLOCATE_JOB_ID {code}" >> {ledger}; exit {code}']


def read_ledger(ledger: Path) -> tuple[Counter, dict[str, int]]:
    starts: Counter = Counter()
    ends: dict[str, int] = {}
    for line in ledger.read_text().splitlines() if ledger.exists() else []:
        parts = line.split()
        if parts[:1] == ["start"] and len(parts) == 2:
            starts[parts[1]] += 1
        elif parts[:1] == ["end"] and len(parts) == 3:
            ends[parts[1]] = int(parts[2])
    return starts, ends


def running_pids(d: Daemon, which: str) -> list[int]:
    """Runner pids (from the API) or the jobs' own pids (from the runners' child records)."""
    pids = []
    try:
        rows = d.client.request("ls")
    except CollocateError:
        return []
    for row in rows:
        if row.get("state") != "running":
            continue
        try:
            attempt = d.client.request("show", id=row["id"])["attempts"][-1]
        except (CollocateError, IndexError, KeyError):
            continue
        if which == "runner" and attempt.get("pid"):
            pids.append(int(attempt["pid"]))
        elif which == "job":
            try:
                pids.append(int(json.loads((Path(attempt["dir"]) / "child.json").read_text())["pid"]))
            except (OSError, ValueError, KeyError):
                pass
    return pids


def fill_disk(state: Path, hold_s: float) -> None:
    filler = state.parent / "filler"
    try:
        with open(filler, "wb") as f:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
    except OSError:
        pass  # full (the file may not even have been created)
    time.sleep(hold_s)
    filler.unlink(missing_ok=True)


def run_round(d: Daemon, rng: random.Random, n: int, clients: int, ledger: Path, fault: str,
              stats: Counter) -> dict:
    plan = [(rng.uniform(0.2, 1.0), 0 if rng.random() < 0.8 else 1) for _ in range(n)]
    acked: dict[int, str] = {}
    errors: list[str] = []

    def submit(indices: list[int]) -> None:
        for i in indices:
            seconds, code = plan[i]
            try:
                acked[i] = Client(d.state, timeout_s=60).request(
                    "submit", argv=job_command(ledger, seconds, code), cwd="/", mem="1GiB",
                    name=f"r{stats['rounds']}-{i}", base_env={"PATH": "/usr/bin:/bin"})["id"]
            except CollocateError as exc:
                errors.append(str(exc).splitlines()[0])

    threads = [threading.Thread(target=submit, args=(list(range(c, n, clients)),)) for c in range(clients)]
    for t in threads:
        t.start()
    time.sleep(rng.uniform(0.0, 1.2))  # a random moment: during submits, launches or runs
    killed_jobs: set[str] = set()
    if fault == "daemon":
        d.kill()
        d.start()
    elif fault in ("runner", "job"):
        pids = running_pids(d, fault)
        if pids:
            pid = rng.choice(pids)
            if fault == "job":
                killed_jobs.add(str(pid))
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        else:
            fault = "none"
    elif fault == "disk":
        fill_disk(d.state, 1.0)
    for t in threads:
        t.join()
    stats[f"fault:{fault}"] += 1
    # wait for the round's jobs to end
    ids = set(acked.values())
    deadline = time.monotonic() + 60
    final: dict[str, dict] = {}
    while time.monotonic() < deadline:
        try:
            rows = {r["id"]: r for r in d.client.request("ls", all=True)}
        except CollocateError:
            time.sleep(0.5)
            continue
        final = {i: rows.get(i, {"state": "missing"}) for i in ids}
        if all(r["state"] in ("done", "failed", "cancelled", "missing") for r in final.values()):
            break
        time.sleep(0.2)
    return {"round": stats["rounds"], "plan": plan, "acked": acked, "errors": errors, "final": final,
            "killed_pids": killed_jobs}


def check(result: dict, ledger: Path, job_pids: dict[str, int], rows: list[dict], stats: Counter) -> None:
    starts, ends = read_ledger(ledger)
    acked, final = result["acked"], result["final"]
    by_name = Counter(r["name"] for r in rows)
    stats["submits"] += len(result["plan"])
    stats["client_errors"] += len(result["errors"])
    for i in range(len(result["plan"])):
        name = f"r{result['round']}-{i}"
        if by_name[name] > 1:
            stats["run_twice"] += 1  # one submission queued twice
        if i not in acked:
            stats["unacknowledged_but_stored" if by_name[name] else "unacknowledged"] += 1
    for job_id in acked.values():
        state = final.get(job_id, {}).get("state", "missing")
        stats["jobs"] += 1
        stats[f"state:{state}"] += 1
        if state in ("missing", "pending", "running"):
            stats["lost"] += 1
            continue
        if starts[job_id] > 1:
            stats["run_twice"] += 1
        if str(job_pids.get(job_id)) in result["killed_pids"]:
            stats["jobs_killed"] += 1
            right = state == "failed" or (job_id in ends and state == ("done" if ends[job_id] == 0 else "failed"))
        elif job_id in ends:
            right = state == ("done" if ends[job_id] == 0 else "failed")
        else:
            right = False  # it ended without running to its end, and we did not kill it
        if not right:
            stats["recorded_wrongly"] += 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--jobs", type=int, default=6)
    parser.add_argument("--clients", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    ns = parser.parse_args()
    rng = random.Random(ns.seed)
    base = Path(tempfile.mkdtemp(prefix="collocate-faults-"))
    disk = base / "disk"
    disk.mkdir()
    tmpfs = os.getuid() == 0 and subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=512m,mode=0700", "tmpfs", str(disk)]).returncode == 0
    faults = FAULTS if tmpfs else FAULTS[:3]
    ledger = base / "ledger"
    d = Daemon(disk / "state", base / "daemon.out")
    stats: Counter = Counter()
    wrong: list[dict] = []
    t0 = time.time()
    try:
        d.start()
        for r in range(ns.rounds):
            stats["rounds"] = r
            fault = rng.choice(faults)
            result = run_round(d, rng, ns.jobs, ns.clients, ledger, fault, stats)
            job_pids = _job_pids(d.state)
            before = stats["recorded_wrongly"] + stats["lost"] + stats["run_twice"]
            try:
                rows = d.client.request("ls", all=True)
            except CollocateError:
                rows = []
            check(result, ledger, job_pids, rows, stats)
            if stats["recorded_wrongly"] + stats["lost"] + stats["run_twice"] > before and len(wrong) < 20:
                wrong.append({"round": r, "fault": fault, "final": result["final"], "errors": result["errors"]})
            if r % 10 == 0:
                print(f"round {r}: {dict(stats)}", flush=True)
        stats["rounds"] = ns.rounds
        stats["state_dir_mib"] = round(sum(p.stat().st_size for p in d.state.rglob("*") if p.is_file()) / 2**20)
    finally:
        d.kill()
        for record in d.state.glob("jobs/*/attempt-*/runner.json"):
            try:
                os.killpg(int(json.loads(record.read_text())["pid"]), signal.SIGKILL)
            except (OSError, ValueError, KeyError):
                pass
        if tmpfs:
            subprocess.run(["umount", "-l", str(disk)], check=False)
        shutil.rmtree(base, ignore_errors=True)
    report = {"date": time.strftime("%Y-%m-%d"), "machine": machine(), "args": vars(ns) | {"out": None},
              "faults": list(faults), "wall_s": round(time.time() - t0, 1), "stats": dict(stats),
              "wrong": wrong}
    _write(ns.out, report)


def _job_pids(state: Path) -> dict[str, int]:
    """job id -> the pid of its latest started process (from the runners' child records)."""
    out: dict[str, int] = {}
    for record in sorted(state.glob("jobs/*/attempt-*/child.json")):
        try:
            out[record.parent.parent.name] = int(json.loads(record.read_text())["pid"])
        except (OSError, ValueError, KeyError):
            pass
    return out


def _write(out: Path, report: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"fault_injection-{report['date']}"
    stem.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
    s, m = report["stats"], report["machine"]
    faults = ", ".join(f"{k.split(':')[1]} {v}" for k, v in sorted(s.items()) if k.startswith("fault:"))
    states = ", ".join(f"{k.split(':')[1]} {v}" for k, v in sorted(s.items()) if k.startswith("state:"))
    lines = [
        f"# Fault injection, {report['date']}",
        "",
        f"Machine: {m.get('cores')}-core {m.get('host_cpu')} CPU dev machine, no GPU (Python "
        f"{m.get('python')}). Command: `python benchmarks/fault_injection.py --rounds {report['args']['rounds']} "
        f"--jobs {report['args']['jobs']} --clients {report['args']['clients']} --seed {report['args']['seed']}`"
        f" ({report['wall_s']:.0f} s).",
        "",
        "| rounds | jobs submitted | jobs lost | jobs run twice | jobs recorded wrongly | submits not acknowledged (of them stored) |",
        "| --- | --- | --- | --- | --- | --- |",
        f"| {s.get('rounds', 0)} | {s.get('submits', 0)} | {s.get('lost', 0)} | {s.get('run_twice', 0)} | "
        f"{s.get('recorded_wrongly', 0)} | {s.get('client_errors', 0)} ({s.get('unacknowledged_but_stored', 0)}) |",
        "",
        f"Faults injected: {faults}. Jobs we SIGKILLed ourselves: {s.get('jobs_killed', 0)}. "
        f"Final states: {states}.",
        "",
        "Every fault is a SIGKILL at a random moment of a round (or, as root on a tmpfs state dir, "
        "the disk filled for 1 s); a round's jobs end before the next fault. A `runner`/`job` fault "
        "that found nothing running counts as `none`.",
    ]
    if report["wrong"]:
        lines += ["", "Rounds with a problem (first 20):", "", "```",
                  *(json.dumps(w) for w in report["wrong"]), "```"]
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
