"""The client commands as users type them, against a real daemon on emulated GPUs: names and
stderr holding Rich markup and terminal escape sequences print safely in every command, ``ls``
filters, ``cancel`` ranges/``--all``/``--name``, ``logs`` of a pending job, clear usage errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from daemon_harness import job_argv

from collocate.client.select import me

CLI = [sys.executable, "-m", "collocate.daemon"]  # the daemon's commands alone: quicker to start
# Markup Rich would read ([/] is an error, [lr=...] vanishes), an OSC that retitles the window,
# a screen clear, and an 8-bit CSI.
NASTY = "train.py[lr=0.1,seed=0] [/] [bold]x\x1b]0;pwned\x07\x1b[2J\x9b31m"
RAW = ("\x1b", "\x07", "\x9b")


def cli(d, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLLOCATE_STATE_DIR": str(d.state_dir), "COLUMNS": "120"}
    return subprocess.run([*CLI, *args], env=env, capture_output=True, text=True, timeout=60,
                          check=False, cwd=d.state_dir.parent)


def no_raw_controls(out: subprocess.CompletedProcess) -> bool:
    return not any(c in out.stdout + out.stderr for c in RAW)


def test_names_and_stderr_with_markup_and_escapes_print_safely_everywhere(daemons):
    d = daemons()
    script = f"import sys; sys.stdout.write({NASTY!r}); sys.stderr.write({NASTY!r}); sys.exit(3)"
    failed = d.submit([sys.executable, "-c", script], name=NASTY, mem="1GiB")
    d.wait_state(failed, "failed")
    assert NASTY[-12:] in d.job(failed)["reason"]  # the stderr tail reached the reason
    d.client.request("drain")
    pending = d.submit(job_argv(500, 0.2), name=NASTY, mem="1GiB")

    for args in (["ls", "-a"], ["ls"], ["show", failed], ["show", pending], ["wait", failed],
                 ["logs", pending], ["logs", failed, "--stderr", "-f"]):
        out = cli(d, *args)
        assert out.returncode in (0, 1), (args, out.stderr)
        assert "Traceback" not in out.stderr, args
        assert no_raw_controls(out) or args[0] == "logs", (args, out.stdout, out.stderr)
    listed = cli(d, "ls", "-a").stdout
    assert "train.py[lr=0.1,seed=0]" in listed and "\\x1b" in listed
    shown = cli(d, "show", failed).stdout
    assert NASTY.replace("\x1b", "\\x1b").replace("\x07", "\\x07").replace("\x9b", "\\x9b") in shown
    assert "[/] [bold]" in shown
    # `logs` passes your own job's output through as written; its own lines are escaped.
    followed = cli(d, "logs", failed, "--stderr", "-f")
    assert followed.stdout == NASTY
    assert not any(c in followed.stderr for c in RAW) and f"job {failed} failed" in followed.stderr
    waiting = cli(d, "logs", pending)
    assert waiting.returncode == 0 and f"job {pending} is pending" in waiting.stderr
    assert waiting.stdout == ""


def test_ls_filters_and_cancel_ranges_lists_names_and_all(daemons):
    d = daemons()
    d.client.request("drain")  # everything stays pending: nothing races the assertions
    ids = [d.submit(job_argv(500, 0.2), name=f"{kind}-{i}", mem="1GiB")
           for i, kind in enumerate(["sweep", "sweep", "sweep", "eval", "eval"])]
    assert ids == ["1", "2", "3", "4", "5"]

    rows = json.loads(cli(d, "ls", "--name", "sweep*", "--format", "json").stdout)
    assert [r["id"] for r in rows] == ["1", "2", "3"]
    assert json.loads(cli(d, "ls", "--user", "nobody-here", "--format", "json").stdout) == []
    assert len(json.loads(cli(d, "ls", "-u", me(), "-s", "pending,running", "--format", "json").stdout)) == 5
    bad = cli(d, "ls", "--state", "pending,finished")
    assert bad.returncode == 2 and "unknown job state 'finished'" in bad.stderr
    assert "pending, running, done, failed, cancelled, rejected" in bad.stderr

    out = cli(d, "cancel", "1-2,99")
    assert out.returncode == 1, out.stderr
    assert out.stdout.splitlines() == ["1: cancelled", "2: cancelled"]
    assert "99: not cancelled: no job '99'" in out.stderr
    again = cli(d, "cancel", "2")
    assert again.returncode == 0 and again.stdout.strip() == "2: already cancelled, nothing to cancel"
    # An ended state in --state lists ended jobs without --all.
    cancelled = json.loads(cli(d, "ls", "--state", "cancelled", "--format", "json").stdout)
    assert [r["id"] for r in cancelled] == ["1", "2"]

    by_name = cli(d, "cancel", "--name", "eval-*")
    assert by_name.returncode == 0 and by_name.stdout.splitlines() == ["4: cancelled", "5: cancelled"]
    everything = cli(d, "cancel", "--all")
    assert everything.returncode == 0 and everything.stdout.splitlines() == ["3: cancelled"]
    nothing = cli(d, "cancel", "--all")
    assert nothing.returncode == 0 and "no pending or running job of yours" in nothing.stderr
    both = cli(d, "cancel", "3", "--all")
    assert both.returncode == 2 and "not both" in both.stderr


def test_bad_options_get_a_collocate_error_naming_what_is_wanted(tmp_path):
    env = {**os.environ, "COLLOCATE_STATE_DIR": str(tmp_path)}  # no daemon: parsing fails first

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*CLI, *args], env=env, capture_output=True, text=True, timeout=60)

    cases = [
        (["submit", "--priority", "abc", "--", "true"],
         "error: --priority takes a whole number, not 'abc'", "collocate submit --help"),
        (["wait", "1", "--timeout=soon"], "error: --timeout takes a number, not 'soon'", "collocate wait --help"),
        (["show", "1", "--format", "yaml"], "error: unknown --format 'yaml'", "use table or json"),
        (["ls", "--format", "text"], "error: unknown --format 'text'", "use table or json"),
        (["submit", "--mem", "6", "--", "true"], "error: --mem 6 has no unit", "write 6GiB"),
        (["cancel", "3-x"], "error: cannot read job id '3-x'", "3-7"),
        (["submit", "--bogus", "--", "true"], "No such option: --bogus", "collocate submit --help"),
        (["submit", "--mem", "3GiBs", "--", "true"], "error: cannot read memory size '3GiBs'",
         "write 3GiB or 3MiB"),  # never a bare number, which --mem refuses
        (["submit", "--time", "soon", "--", "true"], "error: cannot read --time 'soon'", "HH:MM:SS"),
    ]
    for args, message, hint in cases:
        out = run(*args)
        assert out.returncode == 2, (args, out.stderr)
        assert message in out.stderr and hint in out.stderr, (args, out.stderr)
        assert "Traceback" not in out.stderr and "Input should be" not in out.stderr
    assert run("ls", "--help").returncode == 0
    missing = subprocess.run([sys.executable, "-m", "collocate.cli", "estimate", "pkg.mod:fn"], env=env,
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "error: --batch-size is missing: give a whole number" in missing.stderr


def test_a_jobs_own_words_cannot_forge_or_colour_daemon_log_lines(daemons):
    """The reason logged for a failed attempt quotes the job's stderr: escape sequences and
    bidirectional overrides in it arrive in ``daemon.log`` as visible escapes, never as terminal
    sequences for whoever reads the log."""
    d = daemons()
    evil = "first\nlast \x1b]0;pwned\x07 \x1b[2J\u202eforged"
    job = d.submit([sys.executable, "-c", f"import sys; sys.stderr.write({evil!r}); sys.exit(3)"],
                   mem="1GiB")
    d.wait_state(job, ("failed", "done"))
    log = (d.state_dir / "daemon.log").read_text()
    assert f"job {job} attempt 1" in log
    assert "\x1b" not in log and "\x07" not in log and "\u202e" not in log
    assert "last \\x1b]0;pwned\\x07 \\x1b[2J\\u202eforged" in log  # the job's words, shown not sent


def test_cancel_of_a_job_that_ended_before_a_restart_says_so(daemons):
    """The daemon answers for ended jobs from its store (the CLI no longer fetches the history)."""
    d = daemons()
    done = d.submit(["/bin/true"], mem="1GiB")
    d.wait_state(done, "done")
    d.kill(signal.SIGTERM)
    d.start()
    out = cli(d, "cancel", done)
    assert out.returncode == 0 and out.stdout.strip() == f"{done}: already done, nothing to cancel", out


def test_gpus_watch_into_a_file_appends_a_table_every_second(daemons, tmp_path):
    d = daemons()
    out = tmp_path / "gpus.txt"
    with out.open("w") as sink:
        watch = subprocess.Popen([*CLI, "gpus", "--watch", "--state-dir", str(d.state_dir)],
                                 stdout=sink, stderr=subprocess.PIPE)
        try:
            deadline = time.monotonic() + 60
            while out.read_text().count("COMMITTED") < 2 and time.monotonic() < deadline:
                time.sleep(0.2)
        finally:
            watch.send_signal(signal.SIGINT)
            watch.wait(timeout=30)
    text = out.read_text()
    assert text.count("COMMITTED") >= 2 and text.count("A100-40GB") >= 4, text  # not nothing


def test_every_command_that_prints_speaks_json(daemons):
    """``--format json`` where a command prints something a script would read: ``submit``
    (an object; a sweep, a list), ``logs`` (one object with the whole output, the job's own
    bytes escaped by JSON; not with ``-f``), ``drain``/``resume``, ``suspend``/``resume ID``
    and ``dashboard-url``. (ls, show, cancel, wait, gpus, hold, release, priority, update and
    limits have their own tests.)"""
    d = daemons("--dashboard", "0")
    code = "import sys; print('hi \\x1b[2J'); sys.stderr.write('oops')"
    one = cli(d, "submit", "--mem", "1GiB", "--name", "hello", "--format", "json", "--", sys.executable, "-c", code)
    assert one.returncode == 0, one.stderr
    queued = json.loads(one.stdout)
    assert (queued["id"], queued["name"], queued["mem_mib"], queued["mem_source"]) == ("1", "hello", 1024.0, "declared")
    d.wait_state("1", "done")
    out = json.loads(cli(d, "logs", "1", "--format", "json").stdout)
    assert out == {"id": "1", "state": "done", "reason": out["reason"], "attempt": 1, "stream": "stdout",
                   "node": None, "notify": False, "text": "hi \x1b[2J\n", "purged": False}
    assert json.loads(cli(d, "logs", "1", "--stderr", "--format", "json").stdout)["text"] == "oops"
    followed = cli(d, "logs", "1", "-f", "--format", "json")
    assert followed.returncode == 2 and "not with -f" in followed.stderr and "collocate wait 1" in followed.stderr

    assert json.loads(cli(d, "drain", "--format", "json").stdout) == {"draining": True, "running": 0, "pending": 0}
    sweep = json.loads(cli(d, "submit", "--mem", "1GiB", "--sweep", "i=1..2", "--format", "json", "--",
                           "/bin/echo", "{i}").stdout)
    assert [(r["id"], r["name"], r["state"]) for r in sweep] == [("2", "echo[i=1]", "pending"),
                                                                 ("3", "echo[i=2]", "pending")]
    waiting = json.loads(cli(d, "logs", "2", "--format", "json").stdout)
    assert waiting["attempt"] is None and waiting["state"] == "pending" and waiting["text"] == ""
    assert "drain" in waiting["reason"]
    assert json.loads(cli(d, "resume", "--format", "json").stdout) == {"draining": False}

    long = d.submit(job_argv(500, 60), mem="1GiB")
    d.wait_state(long, "running")
    frozen = json.loads(cli(d, "suspend", long, "--format", "json").stdout)
    assert frozen == [{"id": long, "state": "suspended"}]
    listed = json.loads(cli(d, "ls", "--state", "suspended", "--format", "json").stdout)
    assert [(r["id"], r["state"], r["suspended"]) for r in listed] == [(long, "running", "user")]
    thawed = cli(d, "resume", long, "--format", "json")
    assert thawed.returncode == 0 and json.loads(thawed.stdout)[0]["id"] == long
    d.client.request("cancel", id=long)
    url = json.loads(cli(d, "dashboard-url", "--format", "json").stdout)
    assert url["url"].startswith("http://127.0.0.1:") and "?token=" in url["url"] and url["token"] is True


def test_a_job_runs_where_you_submit_it_or_in_its_cwd(daemons, tmp_path):
    """sbatch's --chdir: ``--cwd DIR``; without it, the directory ``submit`` ran in."""
    d = daemons()
    there = tmp_path / "elsewhere"
    there.mkdir()
    where = [sys.executable, "-c", "import os; print(os.getcwd())"]
    moved = cli(d, "submit", "--mem", "1GiB", "--cwd", str(there), "--", *where).stdout.strip()
    here = cli(d, "submit", "--mem", "1GiB", "--", *where).stdout.strip()  # cli runs in the state dir's parent
    for job, expected in ((moved, there), (here, d.state_dir.parent)):
        d.wait_state(job, "done")
        assert cli(d, "logs", job).stdout.strip() == str(expected.resolve())
