"""Issue 35's evidence on a real GPU (round F1): the offender pays, and a frozen job loses nothing.

Three scenarios, each on a fresh ``collocate serve --gpus nvml`` (private state directory) with
real PyTorch jobs (``fence_freeze_job.py``), sized from the GPU's memory ``T``:

1. **fence** (``--policy declared-memory --sharing time-slicing``, the fence on, as by default):
   an *honest* job declares 0.55 T, holds 0.35 T and grows to 0.55 T half-way; once it holds its
   first block, an *overrunning* job declares 0.08 T, holds 0.05 T and grows to 0.5 T at 30 % of
   its steps; the honest job's growth waits (``--grow-gate``) until the neighbour grew or crashed
   trying. Together they would need 1.05 T. Expected: the overrunning job gets
   ``torch.OutOfMemoryError`` from its capped allocator (its first attempt ``oom``), the honest
   job finishes in one attempt; the overrunning one is retried and finishes after.
2. **unfenced**: the same, the overrunning job submitted with ``--no-mem-fence``. Expected: the
   honest job crashes when it grows, and the crash is charged to the neighbour (``victim_crashes`` 1, its
   requirement unchanged, no retry used) and the neighbour's requirement rises; both finish.
3. **freeze**: one job alone (``exclusive``), its loss the reference; the same command again,
   ``collocate suspend`` at a third of its steps for ``--frozen-s`` seconds, then ``collocate
   resume``. Expected: its step count stands still while frozen, the GPU reads no SM activity
   from it, it finishes ``done`` with the same loss bit for bit.

``--out`` gets ``summary.json`` (every job's detail, the checks) and ``summary.md``, and one
folder per scenario (``daemon.log``, the jobs' output). ``--dry-run`` does it all on the CPU:
emulated A100-40GB, the jobs holding emulated memory and honouring the fence as the capped
allocator would. Device time: about 4 minutes on an H100/H200 (each job ~20 s of training and
~10 s of start-up).
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from collocate.daemon.child import DaemonProcess

HERE = Path(__file__).resolve().parent
JOB = HERE / "fence_freeze_job.py"
TERMINAL = ("done", "failed", "cancelled", "rejected", "timeout")


def log(msg: str) -> None:
    print(f"[{datetime.now(UTC):%H:%M:%S}] {msg}", flush=True)


class Scenario:
    """A fresh daemon in a private state directory, and what its jobs did."""

    def __init__(self, name: str, out: Path, serve: list[str]) -> None:
        self.dir = out / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.state = Path(tempfile.mkdtemp(prefix="cff-"))  # short: the API socket lives here
        self.daemon = DaemonProcess(self.state, [*serve, "--verbose"], self.dir / "daemon.log",
                                    name=f"the {name} daemon", client_timeout_s=30)
        self.daemon.wait_ready()

    def cli(self, *args: str) -> str:
        command, *rest = args
        res = subprocess.run([sys.executable, "-m", "collocate.cli", command, "--state-dir", str(self.state), *rest],
                             capture_output=True, text=True, timeout=120, check=False)
        if res.returncode != 0:
            raise SystemExit(f"collocate {' '.join(args)} exited {res.returncode}: {res.stderr.strip()}")
        return res.stdout.strip()

    def submit(self, name: str, mem_mib: float, job: list[str], *extra: str) -> str:
        out = self.cli("submit", "--mem", f"{int(mem_mib)}MiB", "--name", name, "--cwd", str(self.dir), *extra,
                       "--", sys.executable, str(JOB), *job)
        return out.splitlines()[-1]

    def show(self, job_id: str) -> dict[str, Any]:
        return self.daemon.client.request("show", id=job_id)

    def gpu(self) -> dict[str, Any]:
        return self.daemon.client.request("gpus")[0]

    def wait(self, what: str, test: Any, timeout_s: float) -> Any:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            got = test()
            if got:
                return got
            time.sleep(0.5)
        raise TimeoutError(f"{self.dir.name}: timed out after {timeout_s:.0f} s waiting for {what}")

    def wait_ended(self, ids: list[str], timeout_s: float) -> list[dict[str, Any]]:
        try:
            self.wait("the jobs to end", lambda: all(self.show(i)["state"] in TERMINAL for i in ids), timeout_s)
        except TimeoutError as e:
            log(f"{e}; cancelling")
            for i in ids:
                self.daemon.client.request("cancel", id=i)
        return [self.show(i) for i in ids]

    def close(self) -> None:
        self.daemon.stop()
        shutil.rmtree(self.state, ignore_errors=True)


def job_args(hold: float, grow: float, grow_at: float, out: Path, *, dry: bool, seed: int = 0,
             progress: Path | None = None, gate: Path | None = None) -> list[str]:
    args = ["--hold-mib", f"{hold:.0f}", "--grow-mib", f"{grow:.0f}", "--grow-at", str(grow_at),
            "--seed", str(seed), "--out", str(out)]
    if dry:  # the CPU rehearsal: few light steps, paced so the jobs overlap
        args += ["--steps", "40", "--inner", "2", "--step-sleep", "0.15"]
    else:  # about 20 s of training on an H100/H200
        args += ["--steps", "300", "--inner", "20", "--step-sleep", "0.05"]
    if progress is not None:
        args += ["--progress", str(progress)]
    if gate is not None:
        args += ["--grow-gate", str(gate)]
    return args


def summary_of(d: dict[str, Any]) -> dict[str, Any]:
    keep = ("id", "name", "state", "reason", "mem_mib", "mem_source", "oom_crashes", "victim_crashes", "fence",
            "suspended", "frozen_s")
    return {**{k: d.get(k) for k in keep},
            "attempts": [{k: a.get(k) for k in ("n", "outcome", "reason", "peak_mib", "mem_mib")}
                         for a in d.get("attempts", [])]}


def overrun_scenario(name: str, out: Path, gpus: str, *, dry: bool, fence: bool, timeout_s: float) -> dict[str, Any]:
    s = Scenario(name, out, ["--gpus", gpus, "--policy", "declared-memory", "--sharing", "time-slicing"])
    try:
        total = float(s.gpu()["total_mib"])
        gate = s.dir / "honest.grow"  # the honest job grows once the neighbour grew (or crashed trying)
        honest = s.submit("honest", 0.55 * total, job_args(0.35 * total, 0.55 * total, 0.5, s.dir / "honest.json",
                                                           dry=dry, gate=gate))
        s.wait("the honest job's first block", lambda: (s.gpu().get("used_mib") or 0) >= 0.3 * total, 120)
        extra = () if fence else ("--no-mem-fence",)
        overrun = s.submit("overrun", 0.08 * total,
                           job_args(0.05 * total, 0.5 * total, 0.3, s.dir / "overrun.json", dry=dry), *extra)
        fenced = s.show(overrun).get("fence", "")
        log(f"{name}: honest {honest}, overrun {overrun} ({fenced})")
        try:
            s.wait("the neighbour's growth or its crash", lambda: (s.gpu().get("used_mib") or 0) >= 0.8 * total
                   or any(a["outcome"] for a in s.show(overrun)["attempts"]), 120)
        finally:
            gate.touch()
        h, o = s.wait_ended([honest, overrun], timeout_s)
    finally:
        s.close()
    h_out = [a["outcome"] for a in h["attempts"]]
    o_out = [a["outcome"] for a in o["attempts"]]
    if fence:
        checks = {
            "the overrunning job's first attempt ended out of memory": o_out[:1] == ["oom"],
            "the honest job finished in one attempt": h["state"] == "done" and h_out == ["succeeded"],
            "the overrunning job finished after": o["state"] == "done",
        }
    else:
        checks = {
            "the honest job finished": h["state"] == "done",
            "no crash of the honest job used a retry or raised its requirement":
                h["oom_crashes"] == 0 and abs(h["mem_mib"] - int(0.55 * total)) < 1,
            "the overrunning job finished": o["state"] == "done",
            "the honest job's crash was charged to the neighbour":
                h_out[:1] == ["oom"] and h["victim_crashes"] >= 1 and o["mem_source"] == "oom-raised",
        }
    return {"scenario": name, "total_mib": total, "fence": fenced, "jobs": [summary_of(h), summary_of(o)],
            "checks": checks}


def freeze_scenario(out: Path, gpus: str, *, dry: bool, frozen_s: float, timeout_s: float) -> dict[str, Any]:
    s = Scenario("freeze", out, ["--gpus", gpus, "--policy", "exclusive"])
    try:
        total = float(s.gpu()["total_mib"])
        ref = s.submit("reference", 0.2 * total, job_args(0.1 * total, 0.0, 0.5, s.dir / "reference.json", dry=dry, seed=7))
        ref_d = s.wait_ended([ref], timeout_s)[0]
        progress = s.dir / "frozen.progress"
        steps = 40 if dry else 300
        frozen = s.submit("frozen", 0.2 * total,
                          job_args(0.1 * total, 0.0, 0.5, s.dir / "frozen.json", dry=dry, seed=7, progress=progress))
        s.wait("a third of its steps", lambda: progress.exists() and int(progress.read_text() or 0) >= steps // 3, 120)
        s.cli("suspend", frozen)
        time.sleep(2.0)  # the freezer has stopped it; what it still reports was in flight
        before = int(progress.read_text())
        sm_frozen = []
        t_end = time.monotonic() + frozen_s
        while time.monotonic() < t_end:
            sm_frozen.append(s.gpu().get("sm_now"))
            time.sleep(1.0)
        after = int(progress.read_text())
        shown = s.show(frozen)
        s.cli("resume", frozen)
        fr_d = s.wait_ended([frozen], timeout_s)[0]
    finally:
        s.close()
    ref_loss = json.loads((s.dir / "reference.json").read_text()) if (s.dir / "reference.json").exists() else {}
    fr_loss = json.loads((s.dir / "frozen.json").read_text()) if (s.dir / "frozen.json").exists() else {}
    readings = [x for x in sm_frozen if x is not None]
    checks = {
        "shown as suspended while frozen": bool(shown.get("suspended")),
        "its steps stood still while frozen": after == before,
        "the GPU read no SM activity while it was frozen": bool(readings) and max(readings) <= 0.02,
        "the frozen job finished done": fr_d["state"] == "done" and ref_d["state"] == "done",
        "the same loss as unfrozen, bit for bit": bool(ref_loss) and ref_loss.get("loss_hex") == fr_loss.get("loss_hex"),
    }
    return {"scenario": "freeze", "steps_before": before, "steps_after": after, "frozen_s": frozen_s,
            "sm_while_frozen": sm_frozen, "reference": ref_loss, "frozen": fr_loss,
            "jobs": [summary_of(ref_d), summary_of(fr_d)], "shown_while_frozen": summary_of(shown), "checks": checks}


def write_summary(out: Path, doc: dict[str, Any]) -> None:
    (out / "summary.json").write_text(json.dumps(doc, indent=1))
    lines = [f"# Issue 35 on {doc['gpus']}: the offender pays, a frozen job loses nothing ({doc['date']})", "",
             f"`{' '.join(doc['argv'])}`; {doc['host']}", ""]
    for sc in doc["scenarios"]:
        lines += [f"## {sc['scenario']}", "", "| check | met |", "|---|---|"]
        lines += [f"| {k} | {'yes' if v else 'NO'} |" for k, v in sc["checks"].items()]
        lines += ["", "| job | state | attempts | requirement | fence |", "|---|---|---|---|---|"]
        lines += [f"| {j['name']} | {j['state']} | {', '.join(a['outcome'] or '?' for a in j['attempts'])} | "
                  f"{j['mem_mib'] or 0:.0f} MiB ({j['mem_source']}) | {j.get('fence') or ''} |" for j in sc["jobs"]]
        lines.append("")
    for sc in doc.get("errors", []):
        lines.append(f"- {sc}")
    (out / "summary.md").write_text("\n".join(lines) + "\n")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--dry-run", action="store_true", help="on the CPU: emulated A100-40GB, CPU jobs")
    p.add_argument("--scenarios", default="fence,unfenced,freeze")
    p.add_argument("--frozen-s", type=float, default=8.0)
    p.add_argument("--timeout-s", type=float, default=150.0, help="per scenario's jobs")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    gpus = "emulated:1xA100-40GB" if args.dry_run else "nvml"
    doc: dict[str, Any] = {"date": f"{datetime.now(UTC):%Y-%m-%d}", "gpus": gpus, "argv": sys.argv,
                           "host": f"{platform.node()} {platform.machine()}", "scenarios": [], "errors": []}
    for name in args.scenarios.split(","):
        log(f"scenario {name}")
        try:
            if name == "freeze":
                sc = freeze_scenario(args.out, gpus, dry=args.dry_run, frozen_s=args.frozen_s, timeout_s=args.timeout_s)
            else:
                sc = overrun_scenario(name, args.out, gpus, dry=args.dry_run, fence=name == "fence",
                                      timeout_s=args.timeout_s)
            doc["scenarios"].append(sc)
            log(f"{name}: {sc['checks']}")
        except (SystemExit, TimeoutError, OSError) as e:
            doc["errors"].append(f"{name}: {e}")
            log(f"{name} did not complete: {e}")
        write_summary(args.out, doc)
    ok = not doc["errors"] and all(all(sc["checks"].values()) for sc in doc["scenarios"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
