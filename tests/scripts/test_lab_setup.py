"""docs/lab.md's set-up, as shipped in scripts/lab/: the systemd unit keeps jobs alive across a
daemon stop and serves the lab's group; the profile snippet points a member's shell at the
daemon; and the unit's own command line, run as root on emulated GPUs, serves a real member
user whose shell has nothing but that snippet (their emulated job claims GPU memory and ends
done), then a stop and a start of the daemon leave a running job running (an upgrade)."""

from __future__ import annotations

import configparser
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

LAB = Path(__file__).resolve().parents[2] / "scripts" / "lab"
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "daemon"))
from lab_harness import GROUP, job_script, lab_members, member_python, why_no_lab  # noqa: E402


def unit() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # systemd keys are case-sensitive
    parser.read(LAB / "collocate-lab.service")
    return parser


def test_the_unit_keeps_jobs_across_a_stop_and_serves_the_group():
    service = unit()["Service"]
    assert service["KillMode"] == "process"  # systemd's default would kill every job
    argv = shlex.split(service["ExecStart"])
    assert argv[1] == "serve" and "--group" in argv and "StateDirectory" not in service
    profile = (LAB / "collocate-profile.sh").read_text()
    state = argv[argv.index("--state-dir") + 1]
    assert f"COLLOCATE_STATE_DIR={state}" in profile
    shell = subprocess.run(["sh", "-c", f". {LAB / 'collocate-profile.sh'}; . {LAB / 'collocate-profile.sh'};"
                            " echo $COLLOCATE_STATE_DIR; echo $PATH"], env={"PATH": "/usr/bin:/bin"},
                           capture_output=True, text=True, check=True)
    assert shell.stdout.split() == [state, "/usr/bin:/bin:/opt/collocate/bin"]  # once, however often sourced


@pytest.mark.skipif(why_no_lab() is not None, reason=str(why_no_lab()))
def test_the_units_command_line_serves_a_member_on_emulated_gpus(tmp_path):
    alice = lab_members()[0]
    base = Path(tempfile.mkdtemp(prefix="collocate-unit-"))
    os.chmod(base, 0o755)
    state = base / "collocate-lab"
    argv = shlex.split(unit()["Service"]["ExecStart"])[1:]
    argv[argv.index("--state-dir") + 1] = str(state)
    argv[argv.index("--group") + 1] = GROUP
    argv[argv.index("--gpus") + 1] = "emulated:2xA100-40GB"
    argv[argv.index("--dashboard") + 1] = "127.0.0.1:0"
    profile = (LAB / "collocate-profile.sh").read_text().replace("/var/lib/collocate-lab", str(state))
    (base / "profile.sh").write_text(profile)
    daemon = None
    try:
        def start() -> subprocess.Popen:
            proc = subprocess.Popen([sys.executable, "-m", "collocate.cli", *argv, "--period", "0.2"],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            deadline = time.monotonic() + 30
            while not (state / "collocate.sock").exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            return proc

        daemon = start()
        python, _ = member_python()

        def as_alice(*args: str) -> subprocess.CompletedProcess:
            """A login shell of alice's: the profile snippet, then collocate (no --state-dir)."""
            line = " ".join(shlex.quote(a) for a in (python, "-m", "collocate.daemon", *args))
            return subprocess.run(["sh", "-c", f". {base / 'profile.sh'}; {line}"], **alice.popen_args(),
                                  capture_output=True, text=True, timeout=60)

        work = base / "work"
        work.mkdir(mode=0o777)
        os.chmod(work, 0o777)
        submitted = as_alice("submit", "--mem", "1GiB", "--cwd", str(work), "--", python, job_script(), "1024", "2")
        assert submitted.returncode == 0, submitted.stderr
        long = as_alice("submit", "--mem", "1GiB", "--cwd", str(work), "--", "/bin/sleep", "30")
        assert long.returncode == 0, long.stderr
        job, sleeper = submitted.stdout.strip(), long.stdout.strip()
        waited = as_alice("wait", job, "--timeout", "60")
        assert waited.returncode == 0 and waited.stdout.strip() == f"{job} done", waited.stdout + waited.stderr
        # an upgrade: the daemon stops (SIGTERM, as systemd does with KillMode=process) and starts
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=30)
        daemon = start()
        listed = as_alice("ls", "--format", "json")
        assert listed.returncode == 0, listed.stderr
        assert [(r["id"], r["state"]) for r in json.loads(listed.stdout)] == [(sleeper, "running")]
        assert as_alice("cancel", sleeper).returncode == 0
    finally:
        if daemon is not None and daemon.poll() is None:
            daemon.kill()
            daemon.wait(timeout=30)
        for record in state.glob("jobs/*/attempt-*/runner.json"):
            try:
                os.killpg(int(json.loads(record.read_text())["pid"]), signal.SIGKILL)
            except (OSError, ValueError, KeyError):
                pass
        shutil.rmtree(base, ignore_errors=True)
