"""Fault injection: a real daemon whose daemon, runners, jobs and nodes are killed at random
moments, whose jobs flood their logs and try to outlive themselves, with concurrent clients and
a member whose requests are timed throughout; counts jobs lost, run twice or recorded wrongly.

    python benchmarks/fault_injection.py [--rounds 200] [--node-rounds 20] [--jobs 6] [--clients 3] [--seed 1]

Each round: ``--clients`` threads submit ``--jobs`` short shell jobs between them (through
``Client``, which retries with an idempotency key), while one fault is injected at a random
moment:

* ``daemon``, ``runner``, ``job``: SIGKILL of the daemon (restarted at once), of a running job's
  runner, or of a job's own process;
* ``disk`` (as root, on a 512 MiB tmpfs state dir): the disk filled for a second;
* ``flood``: one more job writes 200 MiB to stdout (its log must stay within ``--log-max``);
* ``escape``: one more job leaves ``nohup`` and ``setsid`` children behind, and is cancelled
  half the time (none may outlive it);
* ``foreign`` (issue 31, item 3): a process outside any job holds 30 GiB of GPU 0 for the round.
  The round's jobs claim no GPU memory, so this checks only that nothing else breaks; whether the
  scheduler charges that memory is the scheduling core's check (it records what ``gpus`` showed);
* ``node`` (the ``--node-rounds`` rounds, on a local Ray cluster of 3 nodes with token
  authentication): the raylet of a node running a job is SIGKILLed and not restarted within the
  round; its jobs must be stopped there (fenced) before they run elsewhere. It is started again
  between rounds.

Then the round waits until its jobs have ended and checks each against the truth the jobs wrote
themselves (an append-only ledger outside the state dir: ``start ID ATTEMPT T`` when a job
starts, ``end ID ATTEMPT CODE T`` just before it exits with CODE):

* **lost**: a submit that was acknowledged whose job the daemon does not list, or that never
  ended (submits the client gave up on are counted apart, with whether they were stored);
* **run twice**: two ``end`` lines for a job, two jobs for one submission, or two starts that
  overlapped (a fenced attempt's runner must have recorded its end before the next start);
* **recorded wrongly**: the daemon's final state differs from the truth (``done`` iff the job
  wrote ``end ... 0``; a job we SIGKILLed must be ``failed``, one we cancelled ``cancelled``).

Meanwhile a member (``nobody`` in the daemon's ``--group``, as root) asks for ``gpus`` every
0.25 s; the report gives the worst answer time outside the seconds the daemon was down.
Writes benchmarks/results/fault_injection-<date>.json and .md.
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

from collocate.client.connect import Client, list_jobs
from collocate.common.errors import CollocateError
from collocate.node.cgroups import Cgroups

GPUS = "emulated:2xA100-40GB"
FAULTS = ("daemon", "runner", "job", "disk", "flood", "escape", "foreign")
MEMBER_UID = 65534  # nobody, in nogroup: a member of a root daemon's --group nogroup
PROBE = """
import json, os, socket, sys, time
os.setgroups([]); os.setgid(65534); os.setuid(65534)
with open(sys.argv[2], "a") as out:
    while True:
        t0 = time.time()
        ok = False
        try:
            s = socket.socket(socket.AF_UNIX); s.settimeout(60); s.connect(sys.argv[1])
            s.sendall(b'{"op":"gpus","args":{}}\\n')
            ok = json.loads(s.makefile("rb").readline()).get("ok", False)
            s.close()
        except Exception:
            pass
        out.write(json.dumps([t0, time.time() - t0, ok]) + "\\n"); out.flush()
        time.sleep(0.25)
"""


class Daemon:
    def __init__(self, state: Path, log: Path, extra: list[str]) -> None:
        self.state, self.log_path, self.extra = state, log, extra
        self.proc: subprocess.Popen | None = None
        self.client = Client(state, timeout_s=60)
        self.down: list[tuple[float, float]] = []  # when it was killed, when it answered again

    def start(self) -> None:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "collocate.daemon", "serve", "--state-dir", str(self.state),
                 "--period", "0.2", *self.extra], stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"the daemon exited with {self.proc.returncode}; see {self.log_path}")
            try:
                Client(self.state, timeout_s=5).request("ping")
                return
            except CollocateError:
                time.sleep(0.1)
        raise SystemExit("the daemon did not answer in 180 s")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def restart(self) -> None:
        killed = time.time()
        self.kill()
        self.start()
        self.down.append((killed, time.time()))


def job_command(ledger: Path, seconds: float, code: int, middle: str = "") -> list[str]:
    stamp = '"$COLLOCATE_JOB_ID $COLLOCATE_ATTEMPT'
    return ["/bin/sh", "-c", f'echo "start {stamp[1:]} $(date +%s.%N)" >> {ledger}; {middle}sleep {seconds:.2f}; '
            f'echo "end {stamp[1:]} {code} $(date +%s.%N)" >> {ledger}; exit {code}']


def read_ledger(ledger: Path) -> tuple[dict[str, list[tuple[int, float]]], dict[str, list[int]]]:
    """job id -> its starts (attempt, time), and -> the codes of its ends."""
    starts: dict[str, list[tuple[int, float]]] = {}
    ends: dict[str, list[int]] = {}
    for line in ledger.read_text().splitlines() if ledger.exists() else []:
        parts = line.split()
        if parts[:1] == ["start"] and len(parts) == 4:
            starts.setdefault(parts[1], []).append((int(parts[2]), float(parts[3])))
        elif parts[:1] == ["end"] and len(parts) == 5:
            ends.setdefault(parts[1], []).append(int(parts[3]))
    return starts, ends


def running_pids(d: Daemon, which: str) -> list[tuple[str, int]]:
    """(job id, pid) of running runners (from the API) or jobs (from the runners' child records)."""
    pids = []
    try:
        rows = list_jobs(d.client.request)
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
            pids.append((row["id"], int(attempt["pid"])))
        elif which == "job":
            try:
                pids.append((row["id"], int(json.loads((Path(attempt["dir"]) / "child.json").read_text())["pid"])))
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


class Foreign:
    """A process outside every job holding emulated GPU memory (``collocate.node.emulate_job``)."""

    def __init__(self, state: Path, mib: float, seconds: float) -> None:
        uuid = Client(state).request("gpus")[0]["uuid"]
        code = ("import os, sys\nfrom collocate.node.emulate_job import JobSpec, run_job\n"
                "from pathlib import Path\nsys.exit(run_job(JobSpec(mem_mib=float(sys.argv[1]), "
                "seconds=float(sys.argv[2]), ramp_s=0.0, sm=0.05), Path(sys.argv[3]), os.environ))")
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": uuid, "COLLOCATE_SHARING": "time-slicing"}
        self.proc = subprocess.Popen([sys.executable, "-c", code, str(mib), str(seconds),
                                      str(state / "emulated")], env=env, start_new_session=True,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


def run_round(d: Daemon, rng: random.Random, n: int, clients: int, ledger: Path, fault: str,
              stats: Counter, cluster=None) -> dict:
    r = stats["rounds"]
    plan = [(rng.uniform(0.2, 1.0), 0 if rng.random() < 0.8 else 1, "") for _ in range(n)]
    if fault == "flood":
        plan.append((0.1, 0, "head -c 209715200 /dev/zero | tr '\\0' x; "))
    elif fault == "escape":
        plan.append((1.5, 0, f"nohup sleep 900.{r} >/dev/null 2>&1 & setsid sleep 901.{r} >/dev/null 2>&1 & "))
    elif fault == "node":  # long enough to be running when its node goes, and to be fenced
        plan = [(rng.uniform(8.0, 12.0), 0, "") for _ in range(n)]
    acked: dict[int, str] = {}
    errors: list[str] = []

    def submit(indices: list[int]) -> None:
        for i in indices:
            seconds, code, middle = plan[i]
            try:
                acked[i] = Client(d.state, timeout_s=60).request(
                    "submit", argv=job_command(ledger, seconds, code, middle), cwd="/", mem="1GiB",
                    name=f"r{r}-{i}", base_env={"PATH": "/usr/bin:/bin"})["id"]
            except CollocateError as exc:
                errors.append(str(exc).splitlines()[0])

    threads = [threading.Thread(target=submit, args=(list(range(c, len(plan), clients)),))
               for c in range(clients)]
    for t in threads:
        t.start()
    killed: set[str] = set()
    cancelled: set[str] = set()
    seen: dict = {}
    foreign = None
    time.sleep(rng.uniform(0.0, 1.2))  # a random moment: during submits, launches or runs
    if fault == "daemon":
        d.restart()
    elif fault in ("runner", "job"):
        pids = running_pids(d, fault)
        if pids:
            job_id, pid = rng.choice(pids)
            if fault == "job":
                killed.add(job_id)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        else:
            fault = "none"
    elif fault == "disk":
        fill_disk(d.state, 1.0)
    elif fault == "foreign":
        foreign = Foreign(d.state, 30 * 1024, 6.0)
        time.sleep(1.5)
        seen["gpu0"] = {k: Client(d.state).request("gpus")[0].get(k) for k in ("used_mib", "jobs")}
    for t in threads:
        t.join()
    if fault == "escape" and rng.random() < 0.5 and len(plan) - 1 in acked:
        escaper = acked[len(plan) - 1]
        try:
            Client(d.state).request("cancel", id=escaper)
            cancelled.add(escaper)
        except CollocateError:
            pass
    if fault == "node":
        seen["node"] = lose_a_node(d, cluster, set(acked.values()))
        if seen["node"] is None:
            fault = "none"
    stats[f"fault:{fault}"] += 1
    ids = set(acked.values())
    deadline = time.monotonic() + 120
    final: dict[str, dict] = {}
    while time.monotonic() < deadline:
        try:
            rows = {row["id"]: row for row in list_jobs(d.client.request, all=True, ids=sorted(ids))}
        except CollocateError:
            time.sleep(0.5)
            continue
        final = {i: rows.get(i, {"state": "missing"}) for i in ids}
        if all(row["state"] in ("done", "failed", "cancelled", "missing") for row in final.values()):
            break
        time.sleep(0.2)
    if foreign is not None:
        foreign.stop()
    if seen.get("node"):
        cluster.start(seen["node"])  # back for the next round (its jobs were requeued meanwhile)
    if fault == "flood" and len(plan) - 1 in acked:
        flood = acked[len(plan) - 1]
        log = d.state / "jobs" / flood / "attempt-1" / "stdout.log"
        stats["flood_log_max_bytes"] = max(stats["flood_log_max_bytes"], log.stat().st_size if log.exists() else 0)
        free = shutil.disk_usage(d.state).free
        stats["free_mib_after_a_flood_min"] = min(stats.get("free_mib_after_a_flood_min", 1 << 30), free >> 20)
        log.unlink(missing_ok=True)  # the owner clears it: logs have no retention, and 30 floods
        # of 1/32 of the disk each would fill it (then submits are refused, as designed)
    if fault == "escape":
        left = subprocess.run(["pgrep", "-f", f"^sleep 90[01]\\.{r}$"], capture_output=True, text=True).stdout.split()
        stats["escaped_processes"] += len(left)
        for pid in left:
            os.kill(int(pid), signal.SIGKILL)
    return {"round": r, "fault": fault, "plan": plan, "acked": acked, "errors": errors, "final": final,
            "killed": killed, "cancelled": cancelled, "seen": seen}


def lose_a_node(d: Daemon, cluster, ids: set[str]) -> str | None:
    """Kill the node running one of ``ids`` (its raylet and workers; runners stay, as on a dead
    network); its name, or None when none was running."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        for job_id in sorted(ids):
            try:
                detail = d.client.request("show", id=job_id)
            except CollocateError:
                continue
            if detail["state"] == "running" and detail["attempts"] and detail["attempts"][-1]["pid"]:
                node = detail["attempts"][-1]["gpus"][0].split(":")[0]
                cluster.kill(node)
                return node
        time.sleep(0.2)
    return None


def check(result: dict, ledger: Path, rows: list[dict], stats: Counter, state: Path) -> None:
    starts, ends = read_ledger(ledger)
    acked, final = result["acked"], result["final"]
    by_name = Counter(row["name"] for row in rows)
    stats["submits"] += len(result["plan"])
    stats["client_errors"] += len(result["errors"])
    for error in result["errors"]:
        stats[f"client_error:{error[:80]}"] += 1
    for i in range(len(result["plan"])):
        name = f"r{result['round']}-{i}"
        if by_name[name] > 1:
            stats["run_twice"] += 1  # one submission queued twice
        if i not in acked:
            stats["unacknowledged_but_stored" if by_name[name] else "unacknowledged"] += 1
    for job_id in acked.values():
        state_now = final.get(job_id, {}).get("state", "missing")
        stats["jobs"] += 1
        stats[f"state:{state_now}"] += 1
        if state_now in ("missing", "pending", "running"):
            stats["lost"] += 1
            continue
        overlap = overlapped(job_id, starts.get(job_id, []), state)
        if len(ends.get(job_id, [])) > 1 or overlap:
            stats["run_twice"] += 1
            result.setdefault("evidence", []).append({"job": job_id, "ends": ends.get(job_id),
                                                      "starts": starts.get(job_id), "overlap": overlap})
        if len(starts.get(job_id, [])) > 1:
            stats["jobs_run_again_after_fencing"] += 1
        last = ends[job_id][-1] if ends.get(job_id) else None
        if job_id in result["killed"]:
            stats["jobs_killed"] += 1
            right = state_now == "failed" or (last is not None and state_now == ("done" if last == 0 else "failed"))
        elif job_id in result["cancelled"]:
            stats["jobs_cancelled"] += 1
            right = state_now == "cancelled" or (last is not None and state_now == ("done" if last == 0 else "failed"))
        elif last is not None:
            right = state_now == ("done" if last == 0 else "failed")
        else:
            right = False  # it ended without running to its end, and we did not kill it
        if not right:
            stats["recorded_wrongly"] += 1


def overlapped(job_id: str, starts: list[tuple[int, float]], state: Path) -> str | None:
    """How a later attempt started before an earlier one was stopped (its exit record's end
    time, written by its runner on its node), or an earlier one has no record at all; None when
    none did."""
    for (attempt, _), (_, next_start) in zip(starts, starts[1:], strict=False):
        records = list(state.glob(f"**/jobs/{job_id}/attempt-{attempt}/exit.json"))
        try:
            end = json.loads(records[0].read_text())["end"]
        except (IndexError, OSError, ValueError, KeyError):
            return f"attempt {attempt} has no exit record ({records})"
        if end > next_start:
            return f"attempt {attempt} ended at {end:.3f}, after the next one started ({next_start:.3f})"
    return None


class LocalCluster:
    """Three collocate nodes of a local Ray cluster, with a token and a private temp dir, as
    docs/multi-node.md sets one up (the tests' ``tests/cluster/conftest.py`` does the same)."""

    def __init__(self, base: Path) -> None:
        import secrets

        os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32),
                          RAY_USAGE_STATS_ENABLED="0")
        import ray._common.utils
        from ray.cluster_utils import Cluster

        os.makedirs(ray._common.utils.get_default_ray_temp_dir(), exist_ok=True)
        self.cluster = Cluster(initialize_head=True, head_node_args=dict(
            num_cpus=0, num_gpus=0, object_store_memory=80 * 2**20, include_dashboard=False,
            temp_dir=str(base / "ray")))
        self.nodes: dict[str, object] = {}
        for name in ("n1", "n2", "n3"):
            self.start(name)

    def start(self, name: str) -> None:
        self.nodes[name] = self.cluster.add_node(
            num_cpus=1, num_gpus=0, object_store_memory=80 * 2**20, resources={"collocate": 1},
            labels={"collocate-node": name})

    def kill(self, name: str) -> None:
        self.cluster.remove_node(self.nodes.pop(name), allow_graceful=False)


def probe_member(state: Path, out: Path) -> subprocess.Popen | None:
    """A member asking for ``gpus`` every 0.25 s (as root only: it becomes ``nobody``)."""
    if os.getuid() != 0:
        return None
    out.touch()
    os.chmod(out, 0o666)
    return subprocess.Popen([sys.executable, "-c", PROBE, str(state / "collocate.sock"), str(out)],
                            start_new_session=True)


def member_answers(out: Path, down: list[tuple[float, float]]) -> dict:
    """The member's answer times, outside the daemon's restarts (give each 1 s after it answered)."""
    times, failed, during = [], 0, 0
    for line in out.read_text().splitlines() if out.exists() else []:
        t0, took, ok = json.loads(line)
        if any(a <= t0 + took and t0 <= b + 1.0 for a, b in down):
            during += 1
            continue
        if not ok:
            failed += 1
        times.append(took)
    times.sort()
    return {"requests": len(times), "failed": failed, "during_restarts": during,
            "worst_s": round(times[-1], 3) if times else None,
            "p99_s": round(times[int(0.99 * (len(times) - 1))], 3) if times else None}


def run_phase(d: Daemon, rng: random.Random, ns, rounds: int, faults: tuple[str, ...], ledger: Path,
              stats: Counter, wrong: list[dict], cluster=None) -> None:
    for _ in range(rounds):
        fault = rng.choice(faults)
        result = run_round(d, rng, ns.jobs, ns.clients, ledger, fault, stats, cluster)
        before = stats["recorded_wrongly"] + stats["lost"] + stats["run_twice"]
        try:
            rows = list_jobs(d.client.request, all=True)
        except CollocateError:
            rows = []
        check(result, ledger, rows, stats, d.state)
        if stats["recorded_wrongly"] + stats["lost"] + stats["run_twice"] > before and len(wrong) < 20:
            wrong.append({k: result.get(k) for k in ("round", "fault", "errors", "seen", "evidence")})
        if stats["rounds"] % 10 == 0:
            print(f"round {stats['rounds']}: {dict(stats)}", flush=True)
        stats["rounds"] += 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200, help="rounds on one machine")
    parser.add_argument("--node-rounds", type=int, default=20, help="rounds on a local Ray cluster "
                        "whose fault is a node lost (0: none)")
    parser.add_argument("--jobs", type=int, default=6)
    parser.add_argument("--clients", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    ns = parser.parse_args()
    rng = random.Random(ns.seed)
    base = Path(tempfile.mkdtemp(prefix="collocate-faults-"))
    os.chmod(base, 0o755)  # the member reaches the socket of a --group daemon
    disk = base / "disk"
    disk.mkdir()
    tmpfs = os.getuid() == 0 and subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=512m,mode=0755", "tmpfs", str(disk)]).returncode == 0
    faults = FAULTS if tmpfs else tuple(f for f in FAULTS if f != "disk")
    group = ["--group", "nogroup"] if os.getuid() == 0 else []
    ledger = base / "ledger"
    stats: Counter = Counter()
    wrong: list[dict] = []
    answers: dict[str, dict] = {}
    t0 = time.time()
    daemons: list[Daemon] = []
    probes: list[subprocess.Popen] = []
    cluster = None
    try:
        d = Daemon(disk / "state", base / "daemon.out", ["--gpus", GPUS, *group])
        daemons.append(d)
        d.start()
        probe = probe_member(d.state, base / "member.jsonl")
        probes += [probe] if probe is not None else []
        run_phase(d, rng, ns, ns.rounds, faults, ledger, stats, wrong)
        if probe is not None:
            os.killpg(probe.pid, signal.SIGKILL)
            probe.wait()
            answers["one machine"] = member_answers(base / "member.jsonl", d.down)
        stats["state_dir_mib"] = round(sum(p.stat().st_size for p in d.state.rglob("*") if p.is_file()) / 2**20)
        d.kill()
        if ns.node_rounds:
            private = base / "private"
            private.mkdir(mode=0o700)
            cluster = LocalCluster(private)
            h = Daemon(base / "head", base / "head.out",
                       ["--ray", cluster.cluster.address, "--gpus", GPUS, "--node-grace-s", "4", *group])
            daemons.append(h)
            h.start()
            probe = probe_member(h.state, base / "member-cluster.jsonl")
            probes += [probe] if probe is not None else []
            run_phase(h, rng, ns, ns.node_rounds, ("node",), base / "ledger-cluster", stats, wrong,
                      cluster)  # a ledger of its own: the head numbers its jobs from 1 again
            if probe is not None:
                os.killpg(probe.pid, signal.SIGKILL)
                probe.wait()
                answers["Ray head"] = member_answers(base / "member-cluster.jsonl", h.down)
        stats["rounds"] = ns.rounds + ns.node_rounds
    finally:
        for probe in probes:
            if probe.poll() is None:
                os.killpg(probe.pid, signal.SIGKILL)
        for d in daemons:
            d.kill()
            for record in d.state.glob("**/jobs/*/attempt-*/runner.json"):
                try:
                    os.killpg(int(json.loads(record.read_text())["pid"]), signal.SIGKILL)
                except (OSError, ValueError, KeyError):
                    pass
            time.sleep(0.5)  # the killed jobs leave their cgroups, which can then go
            for key in [d.state, *d.state.glob("nodes/*")]:
                Cgroups.remove_leftovers(str(key))
        if cluster is not None:
            cluster.cluster.shutdown()
        if tmpfs:
            subprocess.run(["umount", "-l", str(disk)], check=False)
        shutil.rmtree(base, ignore_errors=True)
    report = {"date": time.strftime("%Y-%m-%d"), "machine": machine(), "args": vars(ns) | {"out": None},
              "faults": [*faults, *(["node"] if ns.node_rounds else [])], "wall_s": round(time.time() - t0, 1),
              "stats": dict(stats), "member": answers, "wrong": wrong}
    _write(ns.out, report)


def _write(out: Path, report: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"fault_injection-{report['date']}"
    stem.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
    s, m, a = report["stats"], report["machine"], report["args"]
    faults = ", ".join(f"{k.split(':')[1]} {v}" for k, v in sorted(s.items()) if k.startswith("fault:"))
    states = ", ".join(f"{k.split(':')[1]} {v}" for k, v in sorted(s.items()) if k.startswith("state:"))
    member = "; ".join(f"{where}: {v['requests']} answered, worst {v['worst_s']} s, p99 {v['p99_s']} s, "
                       f"{v['failed']} failed ({v['during_restarts']} more during the daemon's restarts)"
                       for where, v in report["member"].items()) or "not measured (needs root)"
    lines = [
        f"# Fault injection, {report['date']}",
        "",
        f"Machine: {m.get('cores')}-core {m.get('host_cpu')} CPU dev machine, no GPU (Python "
        f"{m.get('python')}). Command: `python benchmarks/fault_injection.py --rounds {a['rounds']} "
        f"--node-rounds {a['node_rounds']} --jobs {a['jobs']} --clients {a['clients']} --seed {a['seed']}`"
        f" ({report['wall_s']:.0f} s).",
        "",
        "| rounds | jobs submitted | jobs lost | jobs run twice | jobs recorded wrongly | submits not acknowledged (of them stored) |",
        "| --- | --- | --- | --- | --- | --- |",
        f"| {s.get('rounds', 0)} | {s.get('submits', 0)} | {s.get('lost', 0)} | {s.get('run_twice', 0)} | "
        f"{s.get('recorded_wrongly', 0)} | {s.get('client_errors', 0)} ({s.get('unacknowledged_but_stored', 0)}) |",
        "",
        f"Faults injected: {faults}. Jobs we SIGKILLed ourselves: {s.get('jobs_killed', 0)}; cancelled: "
        f"{s.get('jobs_cancelled', 0)}. Final states: {states}.",
        "",
        f"Log floods: the largest flooded stdout.log held {s.get('flood_log_max_bytes', 0)} bytes; the "
        f"least free space on the state dir's disk after one: {s.get('free_mib_after_a_flood_min', '-')} MiB. "
        f"Processes left behind by `escape` jobs: {s.get('escaped_processes', 0)}. Jobs run again after "
        f"their node was lost (fenced first, never overlapping): {s.get('jobs_run_again_after_fencing', 0)}.",
        "",
        f"A member's `gpus` requests meanwhile: {member}.",
        "",
        "Every fault is injected at a random moment of a round; a round's jobs end before the next "
        "fault. A `runner`/`job`/`node` fault that found nothing running counts as `none`. The "
        "`foreign` fault runs, but what it tests (GPU memory nobody owns charged by the scheduler) "
        "is checked by the scheduling core's own tests; here only that nothing else breaks.",
    ]
    if report["wrong"]:
        lines += ["", "Rounds with a problem (first 20):", "", "```",
                  *(json.dumps(w) for w in report["wrong"]), "```"]
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
