"""A Slurm user's day, against a real daemon on emulated GPUs: job scripts with ``#COLLOCATE``
lines (as ``sbatch`` reads ``#SBATCH``), ``update`` of a pending job (``scontrol update``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from collocate.client.script import script_of
from collocate.common.errors import InputError

CLI = [sys.executable, "-m", "collocate.daemon"]


def cli(d, *args: str, cwd: Path | None = None, columns: int = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLLOCATE_STATE_DIR": str(d.state_dir), "COLUMNS": str(columns)}
    return subprocess.run([*CLI, *args], env=env, capture_output=True, text=True, timeout=60,
                          check=False, cwd=cwd or d.state_dir.parent)


SCRIPT = """#!/bin/bash
# train a model
#COLLOCATE --mem 2GiB --name from-script
#COLLOCATE --time 10   # minutes, as sbatch reads them

#COLLOCATE --env GREETING=hello --env OTHER=2
echo "$GREETING $OTHER $*"
#COLLOCATE --gpus 2
"""


def test_directives_are_read_at_the_top_only(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("train.sh").write_text(SCRIPT)
    script = script_of(["train.sh", "a"])
    assert script is not None
    assert script.argv == ("/bin/bash", "train.sh", "a")  # by its shebang: not executable
    assert [n for n, _ in script.lines] == [3, 4, 6]  # line 8 is after the first command
    assert script.lines[1][1] == ("--time", "10")  # a comment after the options is a comment
    os.chmod("train.sh", 0o755)
    assert script_of(["./train.sh"]).argv == ("./train.sh",)  # executable: run as it is
    Path("plain.sh").write_text("#COLLOCATE --mem 1GiB\necho hi\n")
    assert script_of(["plain.sh"]).argv == ("bash", "plain.sh")  # no shebang: bash, as sbatch
    assert script_of(["python3", "x.py"]) is None  # a program on the PATH, not a file here
    binary = script_of([sys.executable, "-c", "1"])  # a program: run as it is, no directives
    assert binary is not None and (binary.argv, binary.lines) == ((sys.executable, "-c", "1"), ())
    assert script_of(["train.sh"]).sbatch_note() is None
    Path("slurm.sh").write_text("#!/bin/sh\n#SBATCH --mem=16G\n#SBATCHED\n# SBATCH no\necho\n#SBATCH -t 5\n")
    assert script_of(["slurm.sh"]).sbatch == (2,)  # sbatch's own rule: at the top, the word itself
    Path("quote.sh").write_text("#!/bin/sh\n#COLLOCATE --name 'open\n")
    with pytest.raises(InputError, match=r"quote.sh:2: cannot read"):
        script_of(["quote.sh"])


def test_submit_a_script_reads_its_collocate_lines_and_the_command_line_wins(daemons, tmp_path):
    d = daemons()
    d.client.request("drain")
    (tmp_path / "train.sh").write_text(SCRIPT)
    first = cli(d, "submit", "train.sh", "x", "y", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    job = d.job(first.stdout.strip())
    assert (job["name"], job["mem_mib"], job["time_limit_s"], job["gpus"]) == ("from-script", 2048.0, 600.0, 1)
    assert job["argv"] == ["/bin/bash", "train.sh", "x", "y"]
    second = cli(d, "submit", "--name", "cli-name", "--mem", "3GiB", "train.sh", cwd=tmp_path)
    job2 = d.job(second.stdout.strip())
    assert (job2["name"], job2["mem_mib"], job2["time_limit_s"]) == ("cli-name", 3072.0, 600.0)
    d.client.request("resume")
    d.wait_state(job["id"], "done")
    out = cli(d, "logs", job["id"])
    assert out.stdout == "hello 2 x y\n"


def test_a_bad_directive_names_its_file_and_line(daemons, tmp_path):
    d = daemons()
    cases = {"unknown.sh": ("#!/bin/bash\n#COLLOCATE --mem 1GiB\n#COLLOCATE --bogus 3\necho\n",
                            "unknown.sh:3: No such option: --bogus"),
             "extra.sh": ("#!/bin/bash\n#COLLOCATE --mem 1GiB python\necho\n",
                          "extra.sh:2: a #COLLOCATE line takes options only"),
             "unit.sh": ("#!/bin/bash\n\n#COLLOCATE --mem 2\necho\n", "unit.sh:3: --mem 2 has no unit")}
    for name, (text, error) in cases.items():
        (tmp_path / name).write_text(text)
        out = cli(d, "submit", name, cwd=tmp_path)
        assert out.returncode == 2 and error in out.stderr, (name, out.stderr)
        assert "Traceback" not in out.stderr
    assert d.client.request("ls", all=True) == []  # nothing was queued


def test_update_a_pending_job_as_scontrol_update_does(daemons):
    d = daemons()
    d.client.request("drain")
    first = d.submit(["/bin/true"], name="a", mem="1GiB")
    second = d.submit(["/bin/true"], name="b", mem="1GiB")
    out = cli(d, "update", second, "--mem", "4GiB", "--time", "1:00:00", "--name", "bigger",
              "--after", first, "--nice", "5")
    assert out.returncode == 0, out.stderr
    assert "memory 4.00 GiB" in out.stdout and "waits for job 1" in out.stdout
    job = d.job(second)
    assert (job["name"], job["mem_mib"], job["mem_source"], job["time_limit_s"], job["after"],
            job["priority"]) == ("bigger", 4096.0, "declared", 3600.0, [first], -5)
    assert d.client.request("ls")[1]["wait"] == "dependency"
    cycle = cli(d, "update", first, "--after", second)
    assert cycle.returncode == 1 and "would wait for itself" in cycle.stderr
    missing = cli(d, "update", first, "--after", "99", "--format", "json")
    assert missing.returncode == 1 and "job 99, which does not exist" in json.loads(missing.stdout)[0]["error"]
    too_big = cli(d, "update", first, "--mem", "500GiB")
    assert too_big.returncode == 1 and "largest GPU" in too_big.stderr
    cleared = json.loads(cli(d, "update", second, "--after", "", "--format", "json").stdout)
    assert cleared[0]["after"] == [] and cleared[0]["reason"] == ""
    d.client.request("resume")
    d.wait_state(first, "done")
    d.wait_state(second, "done")
    ended = cli(d, "update", first, "--mem", "1GiB")
    assert ended.returncode == 1 and "only a pending job can be changed" in ended.stderr
    assert "cancel it and submit it again" in ended.stderr


def test_a_dependency_added_by_update_is_waited_for_and_released(daemons):
    d = daemons()
    d.client.request("drain")
    first = d.submit(["/bin/true"], name="first", mem="1GiB")
    second = d.submit(["/bin/true"], name="second", mem="1GiB")
    d.client.request("update", id=second, after_notok=[first])  # runs only if first fails
    d.client.request("resume")
    d.wait_state(first, "done")
    assert d.wait_state(second, "cancelled")["reason"].startswith(f"job {first} ended done")


def test_cancel_by_state_and_user_and_json_on_cancel_and_wait(daemons):
    from collocate.client.select import me

    d = daemons()
    d.client.request("drain")
    jobs = [d.submit(["/bin/true"], name=f"j{i}", mem="1GiB") for i in range(3)]
    d.client.request("hold", id=jobs[0])
    nobody = cli(d, "cancel", "--user", "nobody-here")
    assert nobody.returncode == 0 and "no pending or running job matches" in nobody.stderr
    ended = cli(d, "cancel", "--state", "done")
    assert ended.returncode == 2 and "nothing to cancel" in ended.stderr
    both = cli(d, "cancel", "1", "--state", "pending")
    assert both.returncode == 2 and "not both" in both.stderr
    out = cli(d, "cancel", "--state", "pending", "--user", me(), "--name", "j[01]", "--format", "json")
    assert out.returncode == 0, out.stderr
    assert [(r["id"], r["state"]) for r in json.loads(out.stdout)] == [(jobs[0], "cancelled"), (jobs[1], "cancelled")]
    d.client.request("resume")
    waited = cli(d, "wait", *jobs, "--format", "json")
    assert waited.returncode == 1  # two were cancelled
    assert {r["id"]: r["state"] for r in json.loads(waited.stdout)} == {
        jobs[0]: "cancelled", jobs[1]: "cancelled", jobs[2]: "done"}


def test_ls_since_and_until_with_start_and_end_columns(daemons):
    d = daemons()
    done = d.submit(["/bin/true"], name="early", mem="1GiB")
    d.wait_state(done, "done")
    out = cli(d, "ls", "--since", "1h")
    assert out.returncode == 0, out.stderr
    header = out.stdout.splitlines()[0].split()
    assert header[-3:] == ["START", "END", "REASON"] and "early" in out.stdout
    assert [r["id"] for r in json.loads(cli(d, "ls", "--since", "2h", "--format", "json").stdout)] == [done]
    assert json.loads(cli(d, "ls", "--until", "2000-01-01", "--format", "json").stdout) == []
    assert json.loads(cli(d, "ls", "--since", "2999-01-01T00:00", "--format", "json").stdout) == []
    bad = cli(d, "ls", "--since", "yesterday")
    assert bad.returncode == 2 and "cannot read --since 'yesterday'" in bad.stderr


def test_hold_release_and_priority_print_json(daemons):
    d = daemons()
    d.client.request("drain")
    job = d.submit(["/bin/true"], name="h", mem="1GiB")
    held = cli(d, "hold", job, "99", "--format", "json")
    assert held.returncode == 1
    rows = json.loads(held.stdout)
    assert rows[0]["held"] == "user" and rows[1]["id"] == "99" and "no job '99'" in rows[1]["error"]
    assert json.loads(cli(d, "release", job, "--format", "json").stdout)[0]["held"] == ""
    assert json.loads(cli(d, "priority", job, "--set", "-4", "--format", "json").stdout)[0]["priority"] == -4


def test_slurms_short_options_and_state_codes(daemons, tmp_path):
    # what a Slurm user's fingers type: sbatch -J/-t, squeue -t PD -u, scancel -t PD -n,
    # sacct -S/-E, and #COLLOCATE -J in a script
    from collocate.client.select import me

    d = daemons()
    d.client.request("drain")
    (tmp_path / "s.sh").write_text("#!/bin/sh\n#COLLOCATE -J scripted -t 5\ntrue\n")
    scripted = d.job(cli(d, "submit", "--mem", "1GiB", "s.sh", cwd=tmp_path).stdout.strip())
    assert (scripted["name"], scripted["time_limit_s"]) == ("scripted", 300.0)
    ids = [cli(d, "submit", "-J", f"j{i}", "--mem", "1GiB", "--", "/bin/true").stdout.strip() for i in range(2)]
    assert [d.job(i)["name"] for i in ids] == ["j0", "j1"]
    pending = json.loads(cli(d, "ls", "-t", "PD", "-u", me(), "--format", "json").stdout)
    assert sorted(r["id"] for r in pending) == sorted([scripted["id"], *ids])
    mine = json.loads(cli(d, "ls", "--me", "-t", "PD", "--format", "json").stdout)
    assert [r["id"] for r in mine] == [r["id"] for r in pending]
    assert json.loads(cli(d, "ls", "-u", "nobody-here", "--format", "json").stdout) == []
    assert json.loads(cli(d, "ls", "-t", "R", "--format", "json").stdout) == []
    out = cli(d, "cancel", "-t", "PD", "-n", "j*", "--format", "json")
    assert out.returncode == 0, out.stderr
    assert sorted(r["id"] for r in json.loads(out.stdout)) == sorted(ids)
    history = json.loads(cli(d, "ls", "-S", "1h", "-E", "2999-01-01", "-t", "CA", "--format", "json").stdout)
    assert sorted(r["id"] for r in history) == sorted(ids)
    bad = cli(d, "ls", "-t", "XY")  # S is suspended; XY is no state
    assert bad.returncode == 2 and "Slurm's PD, R, S, CD" in bad.stderr

    # a script brought from Slurm: its #SBATCH lines are not read, and the member is told so
    (tmp_path / "old.sh").write_text("#!/bin/sh\n#SBATCH --mem=16G\n#SBATCH -t 60\n#COLLOCATE -J old\ntrue\n")
    old = cli(d, "submit", "--mem", "1GiB", "old.sh", cwd=tmp_path)
    assert old.returncode == 0 and d.job(old.stdout.strip())["name"] == "old"
    assert "old.sh: #SBATCH lines (2, 3) are not read; write the options as #COLLOCATE lines" in old.stderr
    quiet = cli(d, "submit", "--mem", "1GiB", "s.sh", cwd=tmp_path)
    assert quiet.returncode == 0 and quiet.stderr == ""


def test_slips_of_a_slurm_day_are_caught_at_submit_and_said_plainly(daemons, tmp_path):
    # what the first day with collocate tripped on (issue 37): an -o into a directory not made
    # yet (sbatch's job fails when it starts; here submit says so before anything is queued),
    # sacct's -S today / now-1hours / 00:00, a job named by two kinds of dependency, and a
    # command that is not installed
    d = daemons()
    d.client.request("drain")
    missing = cli(d, "submit", "--mem", "1GiB", "-o", "logs/out-%j.txt", "--", "echo", "hi", cwd=tmp_path)
    assert missing.returncode == 2, missing.stderr
    assert f"the directory {tmp_path / 'logs'} does not exist" in missing.stderr and "mkdir -p" in missing.stderr
    swept = cli(d, "submit", "--mem", "1GiB", "--sweep", "s=0..1", "-e", "seed{s}/err.txt", "--", "echo", "{s}",
                cwd=tmp_path)
    assert swept.returncode == 2 and f"{tmp_path / 'seed0'} does not exist" in swept.stderr
    interactive = cli(d, "run", "--mem", "1GiB", "-o", "logs/run.txt", "--", "true", cwd=tmp_path)
    assert interactive.returncode == 2 and "does not exist" in interactive.stderr
    assert d.client.request("ls", all=True) == []  # nothing was queued
    (tmp_path / "logs").mkdir()
    first = cli(d, "submit", "--mem", "1GiB", "-o", "logs/out-%j.txt", "--", "echo", "hi", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    job = first.stdout.strip()
    later = d.submit(["/bin/true"], name="later", mem="1GiB")
    out = cli(d, "update", later, "--after", job, "--after-any", job)
    assert out.returncode == 0 and f"(waits for job {job})" in out.stdout, out.stdout  # once, not twice
    absent = d.submit(["no-such-program-here"], name="absent", mem="1GiB")
    array = cli(d, "submit", "--mem", "1GiB", "--sweep", "i=0..1", "--env", "SLURM_ARRAY_TASK_ID={i}", "--",
                "sh", "-c", "echo task $SLURM_ARRAY_TASK_ID of job $COLLOCATE_JOB_ID")
    assert array.returncode == 0, array.stderr
    tasks = array.stdout.split()
    d.client.request("resume")
    d.wait_state(job, "done")
    assert (tmp_path / "logs" / f"out-{job}.txt").read_text() == "hi\n"
    d.wait_state(later, "done")
    assert "exited with status 127" in d.wait_state(absent, "failed")["reason"]
    said = cli(d, "logs", absent, "--stderr")
    assert "cannot start 'no-such-program-here': command not found on the job's PATH" in said.stdout, said
    for i, task in enumerate(tasks):
        d.wait_state(task, "done")
        assert cli(d, "logs", task).stdout == f"task {i} of job {task}\n"
    every = sorted([job, later, absent, *tasks])
    for since in ("today", "midnight", "00:00", "now-1hours", "now-3600"):
        rows = json.loads(cli(d, "ls", "-S", since, "-E", "now", "--format", "json").stdout)
        assert sorted(r["id"] for r in rows) == every, since
    assert json.loads(cli(d, "ls", "-E", "now-1days", "--format", "json").stdout) == []
    picked = json.loads(cli(d, "ls", "-j", f"{job},{absent}", "-j", "99", "--format", "json").stdout)
    assert sorted(r["id"] for r in picked) == sorted([job, absent])  # squeue -j / sacct -j: ended too
    table = cli(d, "ls", "-j", later, columns=80)
    assert table.returncode == 0 and [line.split()[0] for line in table.stdout.splitlines()] == ["ID", later]


def test_slurms_own_option_names_are_answered_with_ours(tmp_path):
    # Click guesses by spelling (--gres: "--gpus, --nodes, --retries?"); a Slurm user is told
    # what to write instead, on the command line and in a script alike; nothing is queued
    # (no daemon here: these are refused before one is asked)
    class Nowhere:
        state_dir = tmp_path / "state"

    cases = {("submit", "--gres=gpu:1", "--", "true"): "--gres is Slurm's; here write --gpus N",
             ("submit", "--dependency", "afterok:3", "--", "true"): "here write --after N (afterok)",
             ("submit", "-p", "gpu", "--", "true"): "-p is Slurm's and not needed here: a server has one queue",
             ("ls", "--starttime", "2026-11-01"): "here write -S or --since",
             ("submit", "--bogus", "--", "true"): "`collocate submit --help` lists its options",
             ("run", "--dependency", "afterok:3", "--", "true"): "`collocate run --help`"}  # run takes no --after
    for argv, hint in cases.items():
        out = cli(Nowhere, *argv, cwd=tmp_path)
        assert out.returncode == 2 and "No such option" in out.stderr and hint in out.stderr, (argv, out.stderr)
        assert argv[0] != "run" or "Slurm's" not in out.stderr
    (tmp_path / "from_slurm.sh").write_text("#!/bin/sh\n#COLLOCATE --mem 1GiB\n#COLLOCATE --job-name=eq\ntrue\n")
    out = cli(Nowhere, "submit", "from_slurm.sh", cwd=tmp_path)
    assert out.returncode == 2 and "from_slurm.sh:3: No such option: --job-name" in out.stderr
    assert "--job-name is Slurm's; here write -J NAME or --name NAME" in out.stderr
    assert not Nowhere.state_dir.exists()
