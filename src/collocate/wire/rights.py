"""Who may do what through the daemon's API: one rule per operation, written once.

The table below is the whole policy; ``docs/security.md`` prints it, and
``tests/daemon/test_e2e_rights.py`` exercises every row as a second member against a root
daemon. Three parties:

* the **daemon's owner** (``ADMIN``): the user running ``collocate serve``, and root; a TCP
  client with the token acts as the daemon's user, so as the owner;
* a job's **owner** (``OWNER``): the member who submitted it (the socket's peer uid);
* any **member** (``MEMBER``): anyone the daemon serves (its user, root, ``--group``'s members).

What a member sees of *other* members' jobs is what ``squeue`` shows (``redact``): id, name,
user, state, GPUs, memory, times, priority, queue position, and reasons without what the job
printed (a failed job's reason quotes its last stderr line, which may hold a password). Their
command, working directory, environment, logs and own metrics stay theirs, unless they opted in
with ``collocate submit --public``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from collocate.common.errors import InputError


class NotAllowed(InputError):
    """A request the rights table refuses (recorded in the audit log)."""


class Who(StrEnum):
    MEMBER = "any member"
    OWNER = "the job's owner (or the daemon's owner)"
    ADMIN = "the daemon's owner (its user, or root)"


#: op -> (who may ask, what a member gets beyond that). Every op the server accepts is here.
RIGHTS: Mapping[str, tuple[Who, str]] = {
    "ping": (Who.MEMBER, "the daemon's state; the dashboard's address, never its token"),
    "gpus": (Who.MEMBER, "every GPU with its jobs, memory committed and used"),
    "history": (Who.MEMBER, "per-GPU and per-user usage over time (no job's command or logs)"),
    "limits": (Who.MEMBER, "reading the per-user caps; changing them is the daemon owner's"),
    "submit": (Who.MEMBER, "jobs run as the submitter; a priority above 0 is the daemon owner's "
                           "to give, a member may only lower their own (--nice)"),
    "ls": (Who.MEMBER, "every job; others' as squeue shows them (no command, stderr in reasons)"),
    "show": (Who.MEMBER, "one job; another's as squeue shows it unless it is --public"),
    "logs": (Who.OWNER, "or any member for a --public job"),
    "cancel": (Who.OWNER, ""),
    "attach": (Who.OWNER, "a running interactive job's terminal (`collocate run`); its keys "
                          "and output pass through the daemon, never to another member"),
    "hold": (Who.OWNER, "a hold by the daemon's owner only they release"),
    "release": (Who.OWNER, "not a hold the daemon's owner set"),
    "priority": (Who.OWNER, "a member may only lower their own job's priority (to -1,000,000)"),
    "update": (Who.OWNER, "a pending job's memory, time, name, dependencies; its priority as `priority`"),
    "purge": (Who.OWNER, "an ended job's stored logs and --notify logs (`collocate purge`); its "
                         "record stays; `before` picks the asker's own ended jobs only"),
    "set_limits": (Who.ADMIN, ""),
    "drain": (Who.ADMIN, ""),
    "resume": (Who.ADMIN, ""),
    "suspend": (Who.OWNER, "a running job on one node, not interactive (Slurm's scontrol suspend)"),
    "resume_job": (Who.OWNER, "one its owner suspended; one the scheduler froze only the daemon's owner"),
}

#: The only reasons whose detail after the first ": " is the job's own output or paths.
_PRIVATE_DETAIL = ("exited with", "could not start the job", "could not launch the job",
                   "the job's runner was")


def is_admin(uid: int) -> bool:
    """The daemon's own user, or root."""
    return uid in (os.getuid(), 0)


def owns(uid: int, owner_uid: int) -> bool:
    """Whether ``uid`` may act on a job ``owner_uid`` submitted (-1: the daemon's own user)."""
    return uid == owner_uid or is_admin(uid) or (owner_uid == -1 and uid == os.getuid())


def check_admin(op: str, uid: int) -> None:
    if RIGHTS[op][0] is Who.ADMIN and not is_admin(uid):
        raise NotAllowed(f"only the daemon's owner may {op.replace('_', ' ')} this daemon",
                         hint="ask the daemon's owner (the user running `collocate serve`, or root)")


def check_owner(action: str, job_id: str, uid: int, owner_uid: int, owner: str) -> None:
    if not owns(uid, owner_uid):
        raise NotAllowed(f"you may not {action} job {job_id}: it belongs to {owner}",
                         hint="ask its owner or the daemon's owner")


def public_reason(reason: str | None) -> str:
    """A reason as other members see it: what collocate decided, not what the job printed."""
    if not reason:
        return reason or ""
    for prefix in _PRIVATE_DETAIL:
        if reason.startswith(prefix):
            return reason.split(": ", 1)[0]
    return reason


#: What another member sees of a job: what ``ls`` shows (``squeue``'s columns), and of
#: ``show`` the scheduling facts beside them. Everything else (command, cwd, notify, identity,
#: runner pids, samples, profile, own metrics, log paths) is the owner's.
SQUEUE_FIELDS = frozenset({
    "id", "name", "state", "reason", "wait", "user", "gpus", "mem_mib", "mem_source", "priority",
    "attempts", "oom_crashes", "submit_time", "start_time", "end_time", "on", "position",
    "elapsed_s", "wait_s", "exit_code", "time_limit_s", "held", "public", "nodes",
    "suspended", "suspended_at", "suspended_why", "frozen_s",  # squeue's ST S: who froze it, why, how long
    # show's, beside them: how many attempts of how many, and what it waits for
    "max_retries", "attempts_used", "after", "after_any", "after_notok", "retry_failures",
    "sweep", "sweep_max"})
#: Of each of ``show``'s attempt rows: when, where, how it ended (``sacct``'s view).
ATTEMPT_FIELDS = ("n", "start", "end", "gpus", "mem_mib", "peak_mib", "returncode", "outcome")


def redact(detail: dict[str, Any]) -> dict[str, Any]:
    """A job row or ``show`` detail as another member may see it (``squeue``'s view)."""
    out = {k: v for k, v in detail.items() if k in SQUEUE_FIELDS}
    out["reason"] = public_reason(out.get("reason"))
    if isinstance(out.get("attempts"), list):  # show's attempt rows (ls counts them)
        out["attempts"] = [{**{k: a.get(k) for k in ATTEMPT_FIELDS},
                            "reason": public_reason(a.get("reason")), "dir": None}
                           for a in out["attempts"]]
    out["redacted"] = True
    return out
