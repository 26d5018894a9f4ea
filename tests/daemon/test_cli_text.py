"""Pure parts of the command line: safe text, job selection, sizes with units, ``ls`` layout,
``logs`` lines for jobs that have not started, and the output of another user's job."""

from __future__ import annotations

import io
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console

from collocate.client import render
from collocate.client.follow import print_logs
from collocate.client.select import filter_rows, needs_ended, parse_ids, parse_states, parse_when
from collocate.common.errors import InputError
from collocate.common.safetext import printable
from collocate.common.units import parse_mib, require_unit


@given(st.text())
def test_printable_never_lets_a_control_character_through(text):
    out = printable(text)
    assert not any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in out)
    multi = printable(text, multiline=True)
    assert not any((ord(c) < 0x20 and c not in "\n\t") or 0x7F <= ord(c) <= 0x9F for c in multi)


def test_printable_shows_escapes_and_keeps_ordinary_text():
    assert printable("a[/]b\x1b[2J\x07\x9b\u202e") == "a[/]b\\x1b[2J\\x07\\x9b\\u202e"
    assert printable("résumé 日本 \\n") == "résumé 日本 \\n"
    assert printable("one\r\ntwo\rthree\tx", multiline=True) == "one\ntwo\\rthree\tx"
    assert printable(None) == ""


def test_parse_ids_reads_ranges_and_lists_in_order_once():
    assert parse_ids(["3-5,9", "4", "12"]) == ["3", "4", "5", "9", "12"]
    assert parse_ids(["007"]) == ["7"]
    for bad in ("x", "5-3", "3-", "-3", "1.5", "1-2-3"):
        with pytest.raises(InputError, match="cannot read job id"):
            parse_ids([bad])
    with pytest.raises(InputError, match="more than"):
        parse_ids(["1-100000000"])


def test_states_are_checked_and_ended_ones_need_all_rows():
    assert parse_states(["pending,Running", "done"]) == {"pending", "running", "done"}
    assert not needs_ended({"pending", "running"}) and needs_ended({"failed"})
    with pytest.raises(InputError, match="unknown job state 'finished'"):
        parse_states(["finished"])


def test_state_suspended_picks_the_frozen_running_jobs_which_running_includes():
    # issue 35: `ls` shows a frozen job as suspended, so `--state suspended` finds it (squeue -t S)
    rows = [{"state": "running", "user": "ada", "name": "a", "suspended": "preempt"},
            {"state": "running", "user": "ada", "name": "b", "suspended": ""},
            {"state": "pending", "user": "ada", "name": "c"}]
    assert parse_states(["suspended"]) == {"suspended"} and not needs_ended({"suspended"})
    assert filter_rows(rows, states={"suspended"}) == rows[:1]
    assert filter_rows(rows, states={"running"}) == rows[:2]
    assert filter_rows(rows, states={"pending", "suspended"}) == [rows[0], rows[2]]


def test_since_and_until_read_the_forms_sacct_users_type():
    now = time.mktime((2026, 11, 29, 15, 30, 0, 0, 0, -1))  # a Sunday afternoon, local time
    day = time.mktime((2026, 11, 29, 0, 0, 0, 0, 0, -1))
    assert parse_when("today", "-S", now) == parse_when("midnight", "-S", now) == day
    assert parse_when("now", "-E", now) == now
    assert parse_when("now-2hours", "-S", now) == parse_when("2h", "-S", now) == now - 7200
    assert parse_when("now-90", "-S", now) == now - 90  # sacct: a bare count is seconds
    assert parse_when("now-1days", "-S", now) == parse_when("NOW-1DAY", "-S", now) == now - 86400
    assert parse_when("09:15", "-S", now) == day + 9 * 3600 + 15 * 60  # a time: today's
    assert parse_when("09:15:30", "-S", now) == day + 9 * 3600 + 15 * 60 + 30
    assert parse_when("11/29", "-S", now) == parse_when("11/29/26", "-S", now) == day
    assert parse_when("2026-11-29", "-S", now) == parse_when("11/29/2026", "-S", now) == day
    assert parse_when("2026-11-29T09:15", "-S", now) == day + 9 * 3600 + 15 * 60
    for bad in ("yesterday", "now-2x", "now+", "25:00", "13/40", "2h ago", ""):
        with pytest.raises(InputError, match="cannot read -S") as err:
            parse_when(bad, "-S", now)
        assert "now-2hours" in (err.value.hint or "")


def test_filter_rows_matches_every_filter_and_globs_the_whole_name():
    rows = [{"state": "pending", "user": "ada", "name": "train.py[lr=0.1]"},
            {"state": "running", "user": "bob", "name": "train.py[lr=0.3]"},
            {"state": "pending", "user": "bob", "name": "eval.py"}]
    assert filter_rows(rows, name="train.py*") == rows[:2]
    assert filter_rows(rows, name="train.py[[]lr=0.1]") == rows[:1]
    assert filter_rows(rows, name="train") == []
    assert filter_rows(rows, states={"pending"}, users={"bob"}) == rows[2:]


def test_a_size_typed_by_a_person_needs_a_unit_but_files_keep_bare_mib():
    with pytest.raises(InputError, match="--mem 6 has no unit") as caught:
        require_unit("6", "--mem")
    assert "6GiB" in (caught.value.hint or "")
    require_unit("6GB", "--mem")
    assert parse_mib("6GB") == parse_mib("6GiB") == 6144 and parse_mib("6") == 6


def _row(**kw):
    base = {"id": "1", "name": "job", "state": "pending", "user": "ada", "gpus": 1, "mem_mib": 6144.0,
            "attempts": 0, "oom_crashes": 0, "on": [], "submit_time": time.time(), "reason": ""}
    return {**base, **kw}


def test_ls_fits_120_columns_shows_reasons_and_prints_names_as_written():
    rows = [_row(name="train.py[lr=0.1,seed=0]", reason="memory: needs 6.0 GiB, most free 4.2 GiB "
                 "on node:0 and a long tail " * 3),
            _row(id="12", name="x[/]\x1b]0;pwned\x07" * 4, state="running", on=["node:0/0", "node:0/1"]),
            _row(id="13", state="done", reason="an old requeue"),
            _row(id="14", state="pending", wait="in-flight")]
    c = Console(file=io.StringIO(), width=120, markup=False, emoji=False, highlight=False)
    c.print(render.jobs_table(rows, 120))
    lines = c.file.getvalue().splitlines()
    assert all(len(line) <= 120 for line in lines)
    # squeue's order: running, then pending (queue position first), then ended
    assert "REASON" in lines[0] and "train.py[lr=0.1,seed=0]" in lines[2]
    assert "memory: needs 6.0 GiB" in lines[2] and lines[2].endswith("…")
    assert "\x1b" not in c.file.getvalue() and "x[/]\\x1b" in lines[1]
    assert "old requeue" not in lines[4] and lines[3].rstrip().endswith("in-flight")
    assert "-" in render.when(0) and ":" in render.when(0) and len(render.when(0)) == 19


def test_logs_of_a_pending_job_says_why_and_escapes_another_users_output():
    chunks = iter([
        {"text": "", "offset": 0, "attempt": None, "state": "pending", "reason": "queue: 2 ahead\x1b[2J"},
        {"text": "", "offset": 0, "attempt": None, "state": "pending", "reason": "queue: 2 ahead\x1b[2J"},
        {"text": "hi\x1b]0;x\x07\n", "offset": 9, "attempt": 1, "state": "running", "ended": False,
         "attempts": [{"n": 1}]},
        {"text": "", "offset": 9, "attempt": 1, "state": "done", "ended": True, "attempts": [{"n": 1}]},
    ])
    out, err = io.StringIO(), io.StringIO()
    print_logs(lambda *a, **k: next(chunks), "3", stream="stdout", attempt=None, follow=True,
               out=out, err=err, sleep=lambda s: None, escape_output=True)
    assert err.getvalue().splitlines() == ["--- job 3 is pending: queue: 2 ahead\\x1b[2J ---",
                                           "--- job 3 done ---"]
    assert out.getvalue() == "hi\\x1b]0;x\\x07\n"
    once = iter([{"text": "", "offset": 0, "attempt": None, "state": "cancelled", "reason": "by you"}])
    err = io.StringIO()
    print_logs(lambda *a, **k: next(once), "4", stream="stdout", attempt=None, follow=False,
               out=io.StringIO(), err=err)
    assert err.getvalue() == "--- job 4 cancelled before it started: by you ---\n"


def test_a_sweep_keeps_its_values_in_the_name_and_show_quotes_the_command(capsys):
    from collocate.wire.spec import default_name

    assert default_name(["bash", "-c", "sleep 30 # {learning_rate}"]) == "sleep"  # no placeholder
    name = f"{default_name(['python', 'long_experiment_name.py'])}[learning_rate=0.001,seed=3]"
    cut = render.cut_name(name, 24)
    assert len(cut) == 24 and cut.endswith("[learning_rate=0.001,seed=3]"[-22:]) and "…" in cut
    assert render.cut_name("short[a=1]", 24) == "short[a=1]"
    detail = {"id": "3", "name": "t", "state": "failed", "reason": "exited with status 1",
              "argv": ["python", "train.py", "--tag", "run one", "--note", "it's"], "cwd": "/w",
              "user": "ada", "gpus": 1, "mem_mib": 1024.0, "mem_source": "declared", "attempts_used": 1,
              "max_retries": 3, "oom_crashes": 0, "submit_time": 0.0, "end_time": 1.0, "attempts": []}
    render.print_detail(detail)
    out = capsys.readouterr().out
    assert "python train.py --tag 'run one' --note 'it'\"'\"'s'" in out  # copy, paste, run
    assert "1 attempt(s); out-of-memory crashes are retried up to 3 time(s), other failures are not" in out
    retried = render.retries_line({**detail, "retry_failures": True, "oom_crashes": 1})
    assert retried.startswith("1 attempt(s) of 4 allowed (failures and out-of-memory crashes are retried)")


def test_ls_shows_time_against_the_limit_and_the_queue_order():
    rows = [_row(id="5", position=2), _row(id="6", position=1, priority=-3),
            _row(id="7", state="running", elapsed_s=75.0, time_limit_s=3600.0, on=["n:0"]),
            _row(id="8", state="timeout", elapsed_s=7200.0, time_limit_s=7200.0, exit_code=-15, on=["n:1"])]
    c = Console(file=io.StringIO(), width=160, markup=False, emoji=False, highlight=False)
    c.print(render.jobs_table(rows, 160))
    lines = c.file.getvalue().splitlines()
    assert [line.split()[0] for line in lines[1:]] == ["7", "6", "5", "8"]
    assert "PRIO" in lines[0] and "EXIT" in lines[0] and "1:15/1:00:00" in lines[1]
    assert "2:00:00/2:00:00" in lines[4] and "-15" in lines[4] and "n:1" in lines[4]
    # a job frozen for 10 of its 75 s has run 65 s of its --time (issue 35; squeue's time used)
    assert render.job_time(_row(state="running", elapsed_s=75.0, frozen_s=10.0, time_limit_s=3600.0)) == "1:05/1:00:00"


def test_ls_in_80_columns_never_cuts_ids_states_or_units():
    from rich.console import Console

    from collocate.client.render import jobs_table

    row = {"id": "123456", "name": "a-rather-long-training-name[lr=0.1,seed=3]", "state": "pending",
           "user": "someone-long", "gpus": 2, "nodes": 1, "mem_mib": 12288.0, "priority": -5,
           "attempts": 0, "on": [], "submit_time": 1.8e9, "start_time": None, "end_time": None,
           "elapsed_s": 0.0, "time_limit_s": 7200.0, "position": 1, "exit_code": None,
           "reason": "waits for room: " + "x" * 110, "wait": "memory"}
    start = time.mktime((2026, 11, 29, 8, 12, 0, 0, 0, -1))
    ended = {**row, "id": "99", "state": "cancelled", "exit_code": 137, "on": ["node-a:0", "node-a:1"],
             "start_time": start, "end_time": start + 5400, "reason": "cancelled by its owner"}
    for dated in (False, True):
        c = Console(width=80, record=True, markup=False)
        c.print(jobs_table([row, ended], 80, dated=dated))
        lines = c.export_text().splitlines()
        assert all(len(line.rstrip()) <= 80 for line in lines), lines
        text = "\n".join(lines)
        for whole in ("123456", "pending", "cancelled", "12.00 GiB", "0:00/2:00:00", "137", "ID", "STATE", "MEM"):
            assert whole in text, (whole, text)
        # each reason on lines of its own under its row, from where the row's words begin,
        # wrapped at words: readable, where a column had ~14 characters of it
        pending_at = next(i for i, line in enumerate(lines) if line.startswith("123456 "))
        note = lines[pending_at + 1:pending_at + 3]
        assert all(line.startswith(" " * 7 + ("waits" if n == 0 else "x")) for n, line in enumerate(note)), lines
        assert "".join(line[7:] for line in note) == row["reason"]  # whole: 2 lines of 73
        assert lines[-1] == " " * 7 + "cancelled by its owner"
        if dated:  # sacct's columns stay, the day once: 11-29 08:12 09:42
            assert lines[0].split()[-2:] == ["START", "END"], lines
            assert "11-29 08:12 09:42" in text


def test_a_column_narrowed_for_80_columns_is_never_widened():
    # USER "root" and NAME "long" were padded to their least widths (6, 10) when the terminal
    # was narrow, taking room from REASON
    from collocate.client.render import jobs_table

    row = {"id": "9", "name": "long", "state": "pending", "user": "root", "gpus": 1, "nodes": 1,
           "mem_mib": 4096.0, "priority": -5, "attempts": 0, "on": [], "submit_time": 1.8e9,
           "start_time": None, "end_time": None, "elapsed_s": 0.0, "time_limit_s": 3600.0,
           "position": None, "exit_code": None, "reason": "dependency: waits for job 8", "wait": ""}
    c = Console(width=80, record=True, markup=False)
    c.print(jobs_table([row], 80, dated=True))
    header, line, reason = c.export_text().splitlines()
    # SUBMITTED gave way to START and END (asked for); the reason has a line of its own
    assert header.split() == ["ID", "NAME", "STATE", "USER", "GPUS", "MEM", "PRIO", "TIME", "TRIES", "ON", "START", "END"]
    assert line.startswith("9  long pending root 1    4.00 GiB -5   0:00/1:00:00 0     -  -     -")
    assert reason == "   dependency: waits for job 8"


def test_gpus_in_80_columns_keeps_every_unit():
    from rich.console import Console

    from collocate.client.render import gpu_table

    rows = [{"id": "node-a:0", "node": "node-a", "type": "H100-80GB", "used_mib": 12345.0,
             "committed_mib": 40960.0, "free_mib": 60000.0, "total_mib": 81559.0, "sm_now": 0.42,
             "sm_window": 0.38, "jobs": ["12", "13", "14"]}]
    c = Console(width=80, record=True, markup=False)
    c.print(gpu_table(rows))
    text = c.export_text()
    assert all(len(line.rstrip()) <= 80 for line in text.splitlines()), text
    for whole in ("node-a:0", "H100-80GB", "12.06 GiB", "40.00 GiB", "79.65 GiB", "COMMITTED", "SM WINDOW", "12,"):
        assert whole in text, (whole, text)
    assert "…" not in text


def _detail(n_attempts: int = 3) -> dict:
    """A pending job's ``show`` answer with long values everywhere (reasons, paths, GPU ids)."""
    oom = "CUDA out of memory: tried to allocate 2.00 GiB; GPU 0 has a total capacity of 40 GiB"
    attempts = [{"n": i, "start": 1.8e9 + 100 * i, "end": None if i == n_attempts else 1.8e9 + 100 * i + 50,
                 "gpus": ["node-a:0", "node-a:1", "node-b:12"], "mem_mib": 10240.0, "peak_mib": 11000.0,
                 "peak_so_far": i == n_attempts, "returncode": None if i == n_attempts else -9,
                 "outcome": None if i == n_attempts else "oom", "reason": "" if i == n_attempts else oom}
                for i in range(1, n_attempts + 1)]
    return {"id": "123456", "name": "a-rather-long-training-name[lr=0.1,seed=3]", "state": "pending",
            "reason": "memory: needs 12.00 GiB on each of 2 GPUs, the most room is 9.50 GiB on node-a:3",
            "argv": ["python", "train.py"], "cwd": "/home/someone/" + "very-long-directory/" * 5,
            "user": "someone-long", "gpus": 2, "mem_mib": 12288.0, "priority": -5,
            "mem_source": "measured peak of attempt 2 x 1.25 + 512 MiB", "attempts_used": n_attempts,
            "max_retries": 3, "oom_crashes": n_attempts - 1, "submit_time": 1.8e9, "end_time": None,
            "time_limit_s": 7200.0, "fence": "fenced at 12.00 GiB per GPU (a PyTorch job's caching "
            "allocator is capped there; under MPS its memory limit)", "attempts": attempts,
            "summary": {"job_id": "123456", "user": "u", "name": "n", "first": 0.0, "last": 1.0,
                        "peak_mib": 11000.0, "mean_sm": 0.36, "gpu_hours": 0.5, "occupancy_hours": 0.7,
                        "energy_wh": 0.0, "cpu_hours": 0.1, "peak_rss_mib": 2000.0, "gpus": ["node-a:0"]}}


def test_show_in_80_columns_wraps_and_cuts_nothing():
    """Every value whole: long ones wrap beside their names, attempt reasons go under the
    table when it leaves them no column; wide, REASON is a column again."""
    d = _detail()
    c = Console(width=80, record=True, markup=False, emoji=False, highlight=False)
    render.print_detail(d, c)
    text = c.export_text()
    assert all(len(line.rstrip()) <= 80 for line in text.splitlines()), text
    assert "…" not in text
    flat = " ".join(text.split())
    for whole in ("123456", "pending", "12.00 GiB", "10.00 GiB", "10.74 GiB so far", "node-b:12", "oom",
                  "running", "-9", "11,000 MiB", "2:00:00", "someone-long", d["reason"],
                  "reason #1 " + d["attempts"][0]["reason"], "reason #2 " + d["attempts"][1]["reason"],
                  "not measured: its GPU gave no power reading"):
        assert whole in flat, (whole, text)
    assert d["cwd"] in text.replace(" ", "").replace("\n", "")  # folded, not cut
    wide = Console(width=200, record=True, markup=False, emoji=False, highlight=False)
    render.print_detail(d, wide)
    lines = wide.export_text().splitlines()
    assert any("REASON" in line and "OUTCOME" in line for line in lines)
    assert not any(line.lstrip().startswith("reason #") for line in lines)
    assert any(line.startswith("1 ") and "2027-01-15" in line and d["attempts"][0]["reason"] in line for line in lines)


def test_show_of_a_job_never_started_says_so_rather_than_an_empty_table():
    d = {**_detail(), "attempts": [], "attempts_used": 0, "oom_crashes": 0}
    c = Console(width=80, record=True, markup=False, emoji=False, highlight=False)
    render.print_detail(d, c)
    lines = c.export_text().splitlines()
    assert any(line.split() == ["attempts", "none", "yet"] for line in lines), lines
    assert not any(line.split()[:3] == ["#", "START", "END"] for line in lines), lines


def test_demo_tables_fit_80_columns():
    from collocate.daemon.demo import progress_table, result_table

    class Run:
        def __init__(self, policy: str, makespan: float) -> None:
            self.policy, self.makespan = policy, makespan

        def metrics(self) -> dict:
            return {"makespan": self.makespan, "mean_jct": 12345.6, "oom": 123, "recovered": 123,
                    "failed": 16, "done": 160}

        def counts(self) -> dict:
            return {"pending": 160, "running": 160, "done": 160, "failed": 160, "oom": 123}

    from collocate.core.policies import POLICY_NAMES

    runs = [Run(p, 12345.5) for p in POLICY_NAMES]
    c = Console(width=80, record=True, markup=False)
    c.print(result_table(runs))
    c.print(progress_table(runs, 300.0))
    text = c.export_text()
    assert all(len(line.rstrip()) <= 80 for line in text.splitlines()), text
    assert "…" not in text
    for whole in ("OOM crashes", "recovered", "vs first", "12345.5 s", "1.00x", *POLICY_NAMES):
        assert whole in text, (whole, text)


def test_limits_fit_80_columns(capsys):
    from collocate.client.control import _print_limits

    lim = {"max_jobs": 1000, "max_gpus": 1000, "max_cpu_jobs": 1000}
    _print_limits({"fair_share": False, "half_life_s": 7 * 86400.0, "default": lim,
                   "cpu_jobs_default": 1000, "users": {"someone-long": lim},
                   "usage": {"someone-long": {"running_jobs": 1000, "running_gpus": 1000, "gpu_hours": 12345.67}}})
    out = capsys.readouterr().out
    assert all(len(line) <= 80 for line in out.splitlines()), out
    assert "12345.67 GPU-hours" in out and "at most 1000 running jobs and 1000 GPUs and 1000 CPU jobs" in out


def test_every_commands_help_fits_80_columns_uncut():
    """Typer's help at COLUMNS=80: option names, types and words whole (``serve`` had
    ``$COLLOCATE_STATE_DI…`` and ``--no-dashboard-to…``)."""
    import typer
    from click.testing import CliRunner

    from collocate.cli import COMMANDS, app

    root = typer.main.get_command(app)
    for name in COMMANDS:
        out = CliRunner().invoke(root, [name, "--help"], env={"COLUMNS": "80"})
        assert out.exit_code == 0, (name, out.output)
        assert all(len(line) <= 80 for line in out.output.splitlines()), (name, out.output)
        assert "…" not in out.output, (name, out.output)


def test_a_job_frozen_for_a_higher_one_says_for_which_first_in_80_columns_and_in_show():
    from collocate.core.model import Job, JobState
    from collocate.daemon.views import _suspension

    frozen = Job("7", state=JobState.RUNNING, suspended="preempt", suspended_at=time.time(),
                 suspended_why="for job 12 of higher priority (5 > 0); thaws when it ends")
    row = _row(id="7", name="train-resnet50[lr=0.1]", state="running", on=["node:0"], priority=0,
               **_suspension(frozen))
    c = Console(width=80, record=True, markup=False)
    c.print(render.jobs_table([row, _row(id="12", state="running", priority=5, on=["node:0"])], 80))
    lines = c.export_text().splitlines()
    assert all(len(line.rstrip()) <= 80 for line in lines), lines
    assert "suspended" in lines[1] and lines[2].startswith("   for job 12 of higher priority"), lines
    out = io.StringIO()
    render.print_detail({**row, "argv": ["train.py"], "cwd": "/w", "mem_source": "declared", "attempts_used": 1,
                         "max_retries": 3, "end_time": None, "attempts": []},
                        Console(file=out, width=200, markup=False, emoji=False, highlight=False))
    shown = " ".join(out.getvalue().split())  # show's fields: name, then its value beside it
    assert "suspended by the scheduler (preemption) since" in shown
    assert "for job 12 of higher priority (5 > 0); thaws when it ends" in shown


def test_runs_live_line_ends_cut_text_with_an_ellipsis():
    from collocate.client.interactive import live_line

    line = "job 12 waits, position 3: memory: needs 12.00 GiB, most free 4.20 GiB on node-a:0 " * 2
    assert live_line(line, 80) == line[:78] + "…" and len(live_line(line, 80)) == 79
    assert live_line("job 12 waits, position 1", 80) == "job 12 waits, position 1"
    assert live_line("a\x1b[2Jb", 80) == "a\\x1b[2Jb"  # what a job wrote is shown, never obeyed
