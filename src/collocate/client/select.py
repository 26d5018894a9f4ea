"""Which jobs a command means: ``ls`` filters and ``cancel``'s ids, ranges and globs.

Client-side on purpose: ``ls`` asks the daemon for the rows it always gives and filters them
here, and ``cancel`` sends one ``cancel`` per chosen job, so the daemon's API stays small and a
client works with any daemon of the same protocol. The words and forms are the ones Slurm users
type: ``--state pending,running``, ``--user``, ``--name 'sweep*'``, ``cancel 3-7`` or ``3,5,9``.
"""

from __future__ import annotations

import fnmatch
import os
import pwd
from collections.abc import Iterable
from typing import Any

from collocate.common.errors import InputError
from collocate.core.jobstate import JobState

#: Not a state of its own (a frozen job's state stays running) but what ``ls`` shows a frozen
#: job as, so ``--state suspended`` picks those, as ``squeue -t SUSPENDED`` does.
SUSPENDED = "suspended"
STATES = (*(s.value for s in JobState), SUSPENDED)
ACTIVE = (*(s.value for s in JobState if not s.is_terminal), SUSPENDED)  # what cancel can still stop
MAX_RANGE = 10_000  # ids one range may name: `cancel 1-100000000` is a typo, not a request


#: Slurm's state names and codes (``squeue -t PD``, ``sacct -s CD``) for the states they mean.
SLURM_STATES = {"pd": "pending", "r": "running", "s": SUSPENDED, "cd": "done", "completed": "done", "f": "failed",
                "ca": "cancelled", "to": "timeout"}


def parse_states(values: Iterable[str]) -> set[str]:
    """``--state`` values, each a name or a comma list, checked against the job states; Slurm's
    names and codes (``PD``, ``R``, ``COMPLETED``, ...) read as the states they mean."""
    wanted = {v.strip().lower() for value in values for v in value.split(",") if v.strip()}
    wanted = {SLURM_STATES.get(v, v) for v in wanted}
    bad = sorted(wanted - set(STATES))
    if bad:
        raise InputError(f"unknown job state {', '.join(map(repr, bad))}",
                         hint="use " + ", ".join(STATES) + " or Slurm's PD, R, S, CD, F, CA, TO (repeat "
                         "--state or separate with commas)")
    return wanted


def needs_ended(states: set[str]) -> bool:
    """Whether the filter asks for ended jobs, which the daemon lists only with ``all``."""
    return any(s != SUSPENDED and JobState(s).is_terminal for s in states)


def filter_rows(rows: list[dict[str, Any]], *, states: set[str] | None = None,
                users: set[str] | None = None, name: str | None = None) -> list[dict[str, Any]]:
    """The rows matching every filter given (``running`` includes the frozen ones, whose state it
    is; ``suspended`` only those); ``name`` is a shell glob (``sweep*``, ``*[lr=0.1*``
    needs the brackets escaped as ``[[]``), matched case-sensitively against the whole name."""
    return [r for r in rows
            if (not states or r["state"] in states or (SUSPENDED in states and r.get("suspended")))
            and (not users or r["user"] in users)
            and (name is None or fnmatch.fnmatchcase(r["name"], name))]


def parse_ids(values: Iterable[str]) -> list[str]:
    """Job ids as written: ``7``, ``3-7``, ``3,5,9`` and mixes (``1-3,8``), in order, once each."""
    out: dict[str, None] = {}
    for value in values:
        for part in (p.strip() for p in value.split(",")):
            if not part:
                continue
            first, dash, last = part.partition("-")
            if not dash:
                if not _digits(part):
                    raise _bad_id(part)
                out[str(int(part))] = None
                continue
            if not (_digits(first) and _digits(last)) or int(first) > int(last):
                raise _bad_id(part)
            if int(last) - int(first) >= MAX_RANGE:
                raise InputError(f"the range {part} names more than {MAX_RANGE} jobs",
                                 hint="check the ends; `collocate ls --all` lists the ids")
            out.update((str(i), None) for i in range(int(first), int(last) + 1))
    return list(out)


def _digits(text: str) -> bool:
    """ASCII digits only: ``str.isdigit`` also passes ``²``, which ``int`` refuses."""
    return text.isascii() and text.isdigit() and len(text) <= 18


def _bad_id(part: str) -> InputError:
    return InputError(f"cannot read job id {part!r}",
                      hint="write ids, ranges and lists: 7, 3-7, 3,5,9 or 1-3,8")


def me() -> str:
    """The caller's user name as the daemon records it on the jobs they submit (from the uid,
    not from $USER, which ``sudo`` and ``su`` leave behind)."""
    return pwd.getpwuid(os.getuid()).pw_name


#: sacct's ``now-2hours`` units (its default, a bare count, is seconds).
_SACCT_UNITS = {"": 1.0, "s": 1.0, "sec": 1.0, "secs": 1.0, "second": 1.0, "seconds": 1.0,
                "min": 60.0, "mins": 60.0, "minute": 60.0, "minutes": 60.0, "h": 3600.0,
                "hour": 3600.0, "hours": 3600.0, "d": 86400.0, "day": 86400.0, "days": 86400.0,
                "week": 604800.0, "weeks": 604800.0}
WHEN_HINT = ("give a date (2026-11-28), a date and time (2026-11-28T14:00), a time today (14:00), "
             "a time ago (2h, 1d) or sacct's now, today, midnight, now-2hours, 11/28")


def parse_when(text: str, option: str, now: float) -> float:
    """``--since``/``--until`` as sacct reads them: a date (``2026-11-28``, ``11/28``,
    ``11/28/26``), a date and time (``2026-11-28T14:00``, ``2026-11-28 14:00[:00]``), a time
    today (``14:00``, ``14:00:30``), ``now``, ``today`` and ``midnight`` (this day's start),
    ``now-2hours`` (sacct's arithmetic: seconds, minutes, hours, days, weeks), or a time ago
    (``2h``, ``30m``, ``1d``). Why so many: these are the forms Slurm users' fingers type."""
    import re
    import time as _time

    raw = text.strip()
    today = _time.localtime(now)
    for form in ("%Y-%m-%d", "%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M:%S",
                 "%m/%d/%y", "%m/%d/%Y"):
        try:
            return _time.mktime(_time.strptime(raw, form))
        except ValueError:
            continue
    for form, keep in (("%H:%M", "%Y-%m-%d "), ("%H:%M:%S", "%Y-%m-%d "), ("%m/%d", "%Y ")):
        try:
            _time.strptime(raw, form)  # well formed, then on today's date or in this year
            return _time.mktime(_time.strptime(_time.strftime(keep, today) + raw, keep + form))
        except ValueError:
            continue
    word = raw.lower()
    if word in ("today", "midnight"):
        return _time.mktime(_time.strptime(_time.strftime("%Y-%m-%d", today), "%Y-%m-%d"))
    if m := re.fullmatch(r"now(?:([+-])(\d+)([a-z]*))?", word):
        sign, count, unit = m.groups()
        if sign is None:
            return now
        if unit in _SACCT_UNITS:
            return now + (1 if sign == "+" else -1) * int(count) * _SACCT_UNITS[unit]
    if raw and raw[-1].lower() in "smhd":
        from collocate.common.units import parse_duration

        try:
            return now - parse_duration(raw, option)
        except InputError:
            pass
    raise InputError(f"cannot read {option} {text!r}", hint=WHEN_HINT)


def in_window(row: dict[str, Any], since: float | None, until: float | None, now: float) -> bool:
    """Whether a job was in the system (from submission to its end) at some time in
    [``since``, ``until``]: sacct's ``--starttime``/``--endtime``."""
    end = row.get("end_time") or now
    return (since is None or end >= since) and (until is None or row["submit_time"] <= until)
