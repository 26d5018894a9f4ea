"""``collocate.client.textout`` writes ``ls``, ``show`` and ``gpus`` without Rich when nothing
has to wrap: the bytes must be Rich's, in a pipe and on a terminal (bold headers), and whatever
does not fit (wide characters, long reasons, narrow terminals) must still come out as Rich
writes it."""

from __future__ import annotations

import io
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.console import Console as RichConsole

from collocate.client import render, textout


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _both(monkeypatch: pytest.MonkeyPatch, thing: object, width: int, tty: bool) -> tuple[str, str]:
    """What textout writes and what Rich writes for ``thing`` in ``width`` columns."""
    for name in textout.RICH_ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TERM", "xterm")
    ours = Terminal() if tty else io.StringIO()
    monkeypatch.setattr(sys, "stdout", ours)
    textout.Console(width=width, markup=False, emoji=False, highlight=False).print(thing)  # type: ignore[arg-type]
    theirs = io.StringIO()
    RichConsole(file=theirs, width=width, markup=False, emoji=False, highlight=False, force_terminal=tty,
                color_system="standard" if tty else None).print(thing)
    return ours.getvalue(), theirs.getvalue()


def _job(i: int, name: str, reason: str, state: str) -> dict:
    return {"id": str(i), "name": name, "state": state, "user": "ada", "gpus": 1, "nodes": 1,
            "mem_mib": 4096.0 * i, "priority": i % 2, "attempts": 1, "on": ["node:0"] if state == "running" else [],
            "submit_time": 1.8e9 + i, "start_time": None, "end_time": None, "elapsed_s": 61.0 * i,
            "time_limit_s": None if i % 3 else 3600.0, "position": i, "exit_code": 1 if state == "failed" else None,
            "reason": reason, "wait": ""}


names = st.text(alphabet=st.sampled_from("abc_-.[]=,0123456789 é日…"), max_size=40)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(st.tuples(names, names, st.sampled_from(["pending", "running", "failed"])), max_size=5),
       width=st.integers(40, 200), tty=st.booleans(), dated=st.booleans())
def test_ls_is_written_as_rich_writes_it(monkeypatch, rows, width, tty, dated):
    table = render.jobs_table([_job(i + 1, *r) for i, r in enumerate(rows)], width, dated=dated)
    ours, theirs = _both(monkeypatch, table, width, tty)
    assert ours == theirs


def test_plain_tables_need_no_rich_and_match_it(monkeypatch):
    rows = [_job(1, "train.py[lr=0.1]", "", "running"), _job(2, "eval", "memory: needs 8.0 GiB", "pending")]
    table = render.jobs_table(rows, 120)
    assert table.lines(120, styled=False) is not None  # the fast way is taken, not only Rich's
    for tty in (False, True):
        ours, theirs = _both(monkeypatch, table, 120, tty)
        assert ours == theirs and ("\x1b[1mID" in ours) == tty
    long_reason = "memory: needs 8.00 GiB on 1 GPU, most free 4.20 GiB on node-a:0; waits for job 17 to end"
    narrow = render.jobs_table([*rows, _job(3, "eval", long_reason, "pending")], 80, dated=True)
    assert narrow.notes and narrow.lines(80, styled=False) is not None  # reasons under rows: still fast
    for tty in (False, True):
        ours, theirs = _both(monkeypatch, narrow, 80, tty)
        assert ours == theirs and "\n   memory: needs 8.00 GiB" in ours
    gpus = render.gpu_table([
        {"id": "n:0", "node": "n", "type": "A100-40GB", "used_mib": 1024.0, "committed_mib": 2048.0,
         "free_mib": 30000.0, "total_mib": 40960.0, "sm_now": 0.5, "sm_window": 0.25, "jobs": ["1", "2"]},
        {"id": "m:0", "node": "m", "type": "A100-40GB", "used_mib": 0.0, "committed_mib": None,
         "free_mib": None, "total_mib": 40960.0, "sm_now": None, "sm_window": 0.0, "jobs": [],
         "node_event": (1.8e9, "joined")}])
    for width, tty in ((200, False), (80, True), (60, False), (40, True)):
        ours, theirs = _both(monkeypatch, gpus, width, tty)
        assert ours == theirs, (width, tty)
    assert gpus.lines(200, styled=False) is not None


@pytest.mark.parametrize("width", [200, 80, 50])
@pytest.mark.parametrize("tty", [False, True])
def test_show_is_written_as_rich_writes_it(monkeypatch, width, tty):
    detail = {"id": "3", "name": "train", "state": "failed", "reason": "exited with status 1",
              "argv": ["python", "train.py", "--tag", "run one"], "cwd": "/w", "user": "ada", "gpus": 1,
              "mem_mib": 1024.0, "mem_source": "declared", "attempts_used": 2, "max_retries": 3,
              "oom_crashes": 1, "submit_time": 1.8e9, "end_time": 1.8e9 + 60, "notify": ["mail", "ada"],
              "attempts": [{"n": 1, "start": 1.8e9, "end": 1.8e9 + 9, "gpus": ["n:0"], "mem_mib": 1024.0,
                            "peak_mib": 900.0, "returncode": 1, "outcome": "failed", "reason": "exit 1"},
                           {"n": 2, "start": 1.8e9 + 9, "end": None, "gpus": [], "host": "n", "mem_mib": 0.0,
                            "peak_mib": None, "peak_so_far": True, "returncode": None, "outcome": None,
                            "reason": "a reason long enough to be wrapped in a narrow terminal " * 2}]}
    for name in textout.RICH_ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TERM", "xterm")
    ours = Terminal() if tty else io.StringIO()
    monkeypatch.setattr(sys, "stdout", ours)
    monkeypatch.setattr(render, "console", lambda: textout.Console(width=width, markup=False, emoji=False,
                                                                   highlight=False))
    render.print_detail(detail)
    theirs = Terminal() if tty else io.StringIO()
    monkeypatch.setattr(sys, "stdout", theirs)
    monkeypatch.setattr(render, "console", lambda: _RichOnly(width, tty))
    render.print_detail(detail)
    assert ours.getvalue() == theirs.getvalue()


class _RichOnly:
    """A console that always hands to Rich: the reference ``textout`` must match."""

    def __init__(self, width: int, tty: bool) -> None:
        self.rich = RichConsole(width=width, markup=False, emoji=False, highlight=False,
                                force_terminal=tty, color_system="standard" if tty else None)

    @property
    def width(self) -> int:
        return self.rich.width

    def print(self, thing: object = "", style: str = "") -> None:
        self.rich.print(thing, style=style)
