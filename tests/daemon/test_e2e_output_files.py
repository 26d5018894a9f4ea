"""``submit --output/--error`` (sbatch's ``-o/-e``) and the sweep habits of Slurm's arrays, with
real daemons and processes: the files are written as the member who submitted (never as
root: a path they cannot write fails their job, untouched), their patterns filled, a retry
appended; sweep placeholders fill ``--name`` and ``--output``; ``--sweep-max`` holds the rest
of a sweep pending, saying why, and runs them as room in the sweep frees."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from daemon_harness import wait_for
from lab import cli_as, run_as

CLI = [sys.executable, "-m", "collocate.cli"]
_CLI = ("import runpy\nsys.argv = ['collocate', *sys.argv[1:]]\n"
        "runpy.run_module('collocate.daemon', run_name='__main__')\n")


def cli(d, command, *args, timeout=60):
    return subprocess.run([*CLI, command, "--state-dir", str(d.state_dir), *args], capture_output=True,
                          text=True, timeout=timeout, cwd=d.state_dir.parent)


def test_output_files_are_the_members_own_with_patterns_filled_and_retries_appended(lab, lab_daemon):
    d, work = lab_daemon("--log-max", "1MiB")
    a = lab["A"]
    root_file = work / "not-yours.txt"
    root_file.write_text("root's\n")  # 0644, root's: A may read it, not write it

    def submit(*args):  # as A, with the real CLI (``lab.cli_as`` puts --state-dir last: in the command)
        out = run_as(a, _CLI, "submit", "--state-dir", str(d.state_dir), "--gpus", "0", *args,
                     cwd=str(work), check=False)
        assert out.returncode == 0, out.stderr
        return out.stdout.strip()

    (work / "out").mkdir()
    os.chmod(work / "out", 0o777)
    both = submit("--output", "both-%j-%u.txt", "--", "/bin/sh", "-c", "echo out; echo err >&2")
    apart = submit("-o", "out/%x-%j.out", "-e", "out/%x-%j.err", "--name", "apart", "--",
                   "/bin/sh", "-c", "echo to-out; echo to-err >&2")
    retried = submit("--retries", "1", "-o", "retry-%j.txt", "--", "/bin/sh", "-c",
                     'echo "attempt $COLLOCATE_ATTEMPT"; exit 3')
    refused = submit("-o", str(root_file), "--", "/bin/sh", "-c", "echo never")
    big = submit("-o", "big.txt", "--", "/bin/sh", "-c", "head -c 3000000 /dev/zero")

    d.wait_state(both, "done")
    text = (work / f"both-{both}-{a.name}.txt").read_text()
    assert sorted(text.splitlines()) == ["err", "out"]  # stderr with stdout, as sbatch -o alone
    assert (work / f"both-{both}-{a.name}.txt").stat().st_uid == a.uid

    d.wait_state(apart, "done")
    assert (work / "out" / f"apart-{apart}.out").read_text() == "to-out\n"
    assert (work / "out" / f"apart-{apart}.err").read_text() == "to-err\n"
    assert {(work / "out" / f"apart-{apart}.{s}").stat().st_uid for s in ("out", "err")} == {a.uid}
    logs = cli_as(a, d.state_dir, "logs", apart)
    assert logs.stdout == "to-out\n"  # the daemon's logs are kept as before
    shown = " ".join(cli_as(a, d.state_dir, "show", apart).stdout.split())  # values wrap beside names
    assert f"output {work}/out/apart-{apart}.out error {work}/out/apart-{apart}.err" in shown, shown
    theirs = json.loads(cli_as(lab["B"], d.state_dir, "show", apart, "--format", "json").stdout)
    assert theirs["redacted"] and "output" not in theirs and "error" not in theirs  # paths are A's

    d.wait_state(retried, "failed")
    assert (work / f"retry-{retried}.txt").read_text() == (
        f"attempt 1\n[collocate: attempt 2 of job {retried} starts here]\nattempt 2\n")

    d.wait_state(big, "done")
    assert (work / "big.txt").stat().st_size == 3_000_000  # the member's file: all of it, on their disk
    kept = cli_as(a, d.state_dir, "logs", big).stdout  # the daemon's copy: cut at --log-max
    assert len(kept) < 1_200_000 and "stdout is cut from here" in kept

    failed = d.wait_state(refused, "failed")
    assert f"cannot write --output {root_file}: Permission denied" in failed["reason"]
    assert root_file.read_text() == "root's\n" and root_file.stat().st_uid == 0


def test_sweep_placeholders_fill_name_and_output_and_sweep_max_bounds_what_runs(daemons):
    d = daemons("--policy", "exclusive", gpus="emulated:4xA100-40GB")
    work = d.state_dir.parent
    out = cli(d, "submit", "--mem", "1GiB", "--name", "a{i}", "--sweep", "i=1..4", "--sweep-max", "2",
              "-o", "o-%a-{i}-%A-%j.txt", "--", "/bin/sh", "-c", "sleep 1.5; echo done")
    assert out.returncode == 0, out.stderr
    ids = out.stdout.split()
    assert [d.job(i)["name"] for i in ids] == ["a1", "a2", "a3", "a4"]
    wait_for(lambda: d.job(ids[0])["state"] == "running", 30, "the sweep's first job")
    waiting = wait_for(lambda: [r for r in d.client.request("ls") if r["state"] == "pending"
                                and "sweep" in (r.get("reason") or "")], 10, "the sweep's held jobs")
    assert waiting[0]["reason"].endswith(f"sweep {ids[0]}: 2 of its jobs running (--sweep-max 2)")
    for i in ids:
        d.wait_state(i, "done", timeout=60)
    for n, i in enumerate(ids, start=1):
        assert (work / f"o-{n}-{n}-{ids[0]}-{i}.txt").read_text() == "done\n"
    spans = sorted((a["start"], a["end"]) for i in ids for a in d.job(i)["attempts"])
    most = max(sum(1 for s, e in spans if s <= t < e) for t, _ in spans)
    assert most == 2, spans  # two at once (4 free GPUs), never more


def test_an_interactive_run_writes_its_terminals_output_to_its_file_too(daemons, tmp_path):
    from test_e2e_run import Terminal, _env

    d = daemons(gpus="emulated:1xA100-40GB")
    term = Terminal(["run", "-o", str(tmp_path / "run-%j.txt"), "--", "sh", "-c", "echo on-the-terminal"],
                    _env(d.state_dir))
    assert term.status() == 0, term.seen
    written = wait_for(lambda: [p.read_text() for p in tmp_path.glob("run-*.txt")], 10, "the run's file")
    assert "on-the-terminal" in written[0] and "on-the-terminal" in term.seen.decode(errors="replace")
