"""Every request field's type (and the ranges no handler checks), in one table, checked where
requests are parsed.

``protocol.check_request`` runs ``check`` on each request before any handler sees it, so a
field of the wrong type is a clean ``InputError`` naming the op and the field, never an
internal error deep in a handler (``history {"points":"abc"}`` was one). A range the table
gives is the only check of that field (``history points``, ``submit time``); the rest are
checked by their handlers too, in the words of the command's own options (``--gpus must be at
least 1``), along with what only they can check (a job id exists, a directory can be entered,
a duration's text form). A field the table does not name is refused, with the op's known
fields listed (issue 36): a misspelt option is never silently dropped, and nothing reaches a
handler that no row checked. Every op the daemon answers (``rights.RIGHTS``) has its row, even
one that takes no field.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from collocate.common.errors import InputError

MIN_TIME_LIMIT_S = 1.0  # ``submit --time``: shorter is no limit a job could meet
MAX_TIME_LIMIT_S = 365 * 86400.0
MAX_EPOCH_S = 1e11  # ``purge before``: a date within the next 3,000 years
_BIG = 1 << 62

Check = Callable[[Any], bool]


def _int(low: int = -_BIG, high: int = _BIG, *, text: bool = True) -> Check:
    """A whole number in [low, high]: a JSON integer, or (``text``) ASCII digits."""
    def check(v: Any) -> bool:
        if isinstance(v, str) and text:
            s = v.strip().removeprefix("-")
            if not (s.isascii() and s.isdigit() and len(s) <= 18):
                return False
            v = int(v)
        return not isinstance(v, bool) and isinstance(v, int) and low <= v <= high
    return check


def _num(low: float, high: float) -> Check:
    return lambda v: not isinstance(v, bool) and isinstance(v, int | float) and low <= v <= high


def _str(max_len: int = 1 << 20) -> Check:
    return lambda v: isinstance(v, str) and len(v) <= max_len


def _list(item: Check, max_len: int = 1 << 16) -> Check:
    return lambda v: isinstance(v, list) and len(v) <= max_len and all(item(x) for x in v)


def _names_to_text(max_items: int = 1 << 14, max_value: int = 1 << 26) -> Check:
    """An object of text to text (a submit's ``base_env``: the client's environment). Values
    are bounded loosely: how much a member may send at all is ``--user-max-request``'s to say,
    with its own message (``quotas``)."""
    return lambda v: (isinstance(v, dict) and len(v) <= max_items
                      and all(isinstance(k, str) and len(k) <= 4096 and _str(max_value)(x) for k, x in v.items()))


def _any(*checks: Check) -> Check:
    return lambda v: any(c(v) for c in checks)


def _none(v: Any) -> bool:
    return v is None


def _bool(v: Any) -> bool:
    return isinstance(v, bool) or v is None


def _time(v: Any) -> bool:
    """Seconds as a number (at least ``MIN_TIME_LIMIT_S``), or Slurm's text (checked by spec)."""
    if isinstance(v, str):
        return len(v) <= 64
    return v is None or (not isinstance(v, bool) and isinstance(v, int | float)
                         and MIN_TIME_LIMIT_S <= v <= MAX_TIME_LIMIT_S)


_ID = _any(_int(1), _str(32))
_IDS = _any(_none, _list(_any(_int(1), _str(32)), 1000))
_TEXT = _any(_none, _str(4096))

#: op -> field -> (its check, what it must be: said in the error).
FIELDS: Mapping[str, Mapping[str, tuple[Check, str]]] = {
    "ping": {},
    "gpus": {},
    "drain": {},
    "resume": {},
    "limits": {},
    "history": {"since_s": (_num(1e-9, 30 * 86400), "seconds in (0, 30 days]"),
                "points": (_any(_none, _int(1, 10_000, text=False)), "a whole number of 1 to 10000")},
    "ls": {"all": (_bool, "true or false"), "after": (_int(), "a whole number"),
           "limit": (_int(), "a whole number"), "ids": (_any(_none, _list(_ID, 500)), "a list of at most 500 job ids")},
    "show": {"id": (_ID, "a job id"), "series": (_bool, "true or false")},
    "logs": {"id": (_ID, "a job id"), "offset": (_int(0), "a byte offset (0 or more)"),
             "attempt": (_any(_none, _int(1)), "an attempt number (a whole number, 1 or more)"),
             "stream": (_any(_none, _str(16)), "stdout or stderr"), "node": (_TEXT, "a node name"),
             "notify": (_bool, "true or false (its --notify command's output)")},
    "cancel": {"id": (_ID, "a job id")},
    "hold": {"id": (_ID, "a job id")},
    "purge": {"id": (_ID, "a job id"),
              "before": (_num(0, MAX_EPOCH_S), "a time in seconds since the epoch (e.g. 1767225600)")},
    "release": {"id": (_ID, "a job id")},
    "priority": {"id": (_ID, "a job id"), "priority": (_int(text=False), "a whole number")},
    "set_limits": {"user": (_TEXT, "a user name"),
                   "max_jobs": (_any(_none, _int(text=False)), "a whole number"),
                   "max_gpus": (_any(_none, _int(text=False)), "a whole number"),
                   "max_cpu_jobs": (_any(_none, _int(text=False)), "a whole number"),
                   "clear": (_bool, "true or false"), "fair_share": (_bool, "true or false")},
    "submit": {"argv": (_list(_str(), 1 << 16), "a list of strings (the command)"),
               "cwd": (_str(4096), "an absolute directory"),
               "gpus": (_int(), "a whole number"), "nodes": (_int(), "a whole number"),
               "mem": (_any(_none, _str(64), _num(0, 1 << 50)), "a size such as 6GiB"),
               "retries": (_any(_none, _int()), "a whole number"),
               "env": (_any(_none, _list(_str())), "a list of NAME=VALUE strings"),
               "base_env": (_any(_none, _names_to_text()), "an object of names to text values"),
               "name": (_any(_none, _str(1 << 16)), "text"),
               "priority": (_int(), "a whole number of at most 18 digits"),
               "mem_source": (_any(_none, _str(64)), "declared or static-<method>"),
               "mem_uncertainty": (_num(-1e308, 1e308), "a number"),
               "dataset": (_TEXT, "a dataset name"), "dataset_factory": (_TEXT, "a factory"),
               "key": (_any(_none, _str(128)), "a random key"), "public": (_bool, "true or false"),
               "notify": (_any(_none, _str(0), _list(_str(4096), 1024)), "a command (a list of strings)"),
               "after": (_IDS, "a list of job ids"), "after_any": (_IDS, "a list of job ids"),
               "after_notok": (_IDS, "a list of job ids"),
               "time": (_time, f"a duration of at least {MIN_TIME_LIMIT_S:g} s (e.g. 2:00:00 or 3600)"),
               "hold": (_bool, "true or false"), "interactive": (_bool, "true or false"),
               "no_mem_fence": (_bool, "true or false"),
               "output": (_TEXT, "a file path"), "error": (_TEXT, "a file path"),
               "sweep": (_any(_none, _str(32)), "\"new\" or the id of a sweep's first job"),
               "sweep_max": (_any(_none, _int(0, 10_000, text=False)), "a whole number of 0 to 10000")},
    "update": {"id": (_ID, "a job id"), "mem": (_any(_none, _str(64)), "a size such as 6GiB"),
               "time": (_time, f"a duration of at least {MIN_TIME_LIMIT_S:g} s (e.g. 2:00:00 or 3600)"),
               "name": (_any(_none, _str(1 << 16)), "text"),
               "after": (_IDS, "a list of job ids"), "after_any": (_IDS, "a list of job ids"),
               "after_notok": (_IDS, "a list of job ids"),
               "priority": (_any(_none, _int(text=False)), "a whole number")},
    "attach": {"id": (_ID, "a job id")},
    "suspend": {"id": (_ID, "a job id")},
    "resume_job": {"id": (_ID, "a job id")},
}


def check(op: str, args: Mapping[str, Any]) -> None:
    """Raise ``InputError`` for a field ``FIELDS[op]`` does not name, or the first it refuses."""
    fields = FIELDS.get(op, {})
    unknown = sorted(name for name in args if name not in fields)
    if unknown:
        known = ", ".join(sorted(fields)) or "none"
        raise InputError(f"unknown field {quoted(unknown[0])} in {op}; known: {known}",
                         hint="check its spelling; a field only a newer collocate sends needs a "
                              "daemon as new (ask the daemon's owner to upgrade it)")
    for name, (ok, what) in fields.items():
        if name in args and not ok(args[name]):
            raise InputError(f"{op} {name} must be {what}, got {short(args[name])}")


def quoted(name: str) -> str:
    """A field's name as an error quotes it: in double quotes, cut at 64 characters."""
    return json.dumps(name if len(name) <= 64 else name[:61] + "...", ensure_ascii=False)


def short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
