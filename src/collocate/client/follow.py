"""``collocate logs``: print one attempt's output, or follow a job through all its attempts.

Why follow across attempts: a job that crashes out of GPU memory is requeued and runs again, and
so does a retried failure or an attempt lost while the daemon was down. Like ``kubectl logs -f``
across container restarts or ``tail -F`` across a replaced file, ``logs -f`` goes on with each
new attempt until the job ends, and says on stderr why the attempt started (from the outcome
the store recorded for the one before), so the job's own output on stdout stays clean in a pipe.

The daemon answers each ``logs`` request with a chunk of one attempt's file plus a summary of
every attempt; everything here is client-side polling of that, so it works over TCP too.

A job that has not started yet gets a line saying so and why it waits (its ``reason``), rather
than silence. Everything this module writes itself (banners, reasons, which quote stderr) is
escaped with ``safetext.printable``; the job's own output is passed through as written when
the job is the caller's (colours, progress bars), and escaped too when it is someone else's.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TextIO

from collocate.common.safetext import printable
from collocate.common.units import format_mib

TERMINAL = ("done", "failed", "cancelled", "rejected", "timeout")
POLL_S = 0.5

Request = Callable[..., dict[str, Any]]


def why_started(prev: dict[str, Any], cur: dict[str, Any]) -> str:
    """Why attempt ``cur`` exists, from how ``prev`` (the attempt before it) ended."""
    n, outcome, reason = prev["n"], prev.get("outcome"), prev.get("reason") or ""
    if outcome == "oom":
        mem = cur.get("mem_mib")
        return f"after out-of-memory on attempt {n}: requeued" + (
            "" if mem is None else f" with {format_mib(mem)}")
    if outcome == "failed":
        return f"after attempt {n} failed ({reason}): retried" if reason else f"after attempt {n} failed: retried"
    if outcome == "lost":
        return f"after attempt {n} was lost ({reason})" if reason else f"after attempt {n} was lost"
    return f"after attempt {n} ({outcome or 'unknown'})"


def banner(job_id: str, attempts: list[dict[str, Any]], n: int, *, others: bool) -> str | None:
    """The line that introduces attempt ``n``: why it started, and with ``others`` (a plain
    ``logs``) how to print the other attempts. None for a job's only, first attempt."""
    by_n = {a["n"]: a for a in attempts}
    earlier = [k for k in by_n if k < n]
    cause = why_started(by_n[max(earlier)], by_n[n]) if earlier and n in by_n else None
    if others and len(attempts) > 1:
        return (f"--- attempt {n} of {len(attempts)}" + (f" ({cause})" if cause else "")
                + f"; `collocate logs {job_id} --attempt N` prints another ---")
    return None if cause is None else f"--- attempt {n} ({cause}) ---"


def not_started(job_id: str, chunk: dict[str, Any]) -> str:
    """The line for a job with no attempt yet: pending (and why) or ended before it started."""
    state, reason = chunk["state"], printable(chunk.get("reason") or "")
    if state == "pending":
        return f"--- job {job_id} is pending" + (f": {reason}" if reason else "") + " ---"
    if state in TERMINAL:
        return f"--- job {job_id} {state} before it started" + (f": {reason}" if reason else "") + " ---"
    return f"--- job {job_id} is {state}, no output yet" + (f" ({reason})" if reason else "") + " ---"


def ended_badly(job_id: str, chunk: dict[str, Any], stream: str) -> str | None:
    """The line after a failed (or timed out, cancelled) job's stdout: why it ended and, since
    the cause is usually there, how to read its stderr. None for a job that did not end so."""
    state = chunk["state"]
    if state not in TERMINAL or state == "done":
        return None
    reason = printable(chunk.get("reason") or "")
    hint = f"; its stderr: `collocate logs {job_id} --stderr`" if stream == "stdout" else ""
    return f"--- job {job_id} {state}" + (f": {reason}" if reason else "") + hint + " ---"


def print_logs(request: Request, job_id: str, *, stream: str, attempt: int | None, follow: bool,
               out: TextIO, err: TextIO, sleep: Callable[[float], None] = time.sleep,
               escape_output: bool = False, node: str | None = None) -> None:
    """Print attempt ``attempt`` (default: the latest); with ``follow``, keep printing as it
    grows and, unless ``attempt`` pins one, through every later attempt until the job ends.
    ``escape_output`` escapes control characters in the job's output (another user's job)."""
    n, offset = attempt, 0
    shown: int | None = None
    said: str | None = None
    while True:
        chunk = request("logs", id=job_id, offset=offset, attempt=n, stream=stream,
                        **({} if node is None else {"node": node}))
        cur = chunk["attempt"]
        if chunk.get("purged"):
            err.write(f"job {job_id}'s logs were purged (collocate purge); its record stays: "
                      f"collocate show {job_id}\n")
            err.flush()
            return
        if cur is None and (line := not_started(job_id, chunk)) != said:
            err.write(line + "\n")  # again only when the state or reason changes
            err.flush()
            said = line
            if not follow or chunk["state"] in TERMINAL:
                return
        if cur is not None and cur != shown:
            heading = banner(job_id, chunk.get("attempts", []), cur, others=not follow)
            if heading is not None:
                err.write(printable(heading) + "\n")
                err.flush()
            n = shown = cur
        out.write(printable(chunk["text"], multiline=True) if escape_output else chunk["text"])
        out.flush()
        offset = chunk["offset"]
        if chunk["text"]:
            continue
        if not follow:
            if (bad := ended_badly(job_id, chunk, stream)) is not None:
                err.write(bad + "\n")
                err.flush()
            return
        later = [a["n"] for a in chunk.get("attempts", []) if cur is not None and a["n"] > cur]
        if chunk.get("ended") and later and attempt is None:
            n, offset = min(later), 0
            continue
        if chunk["state"] in TERMINAL or (attempt is not None and chunk.get("ended")):
            if attempt is None:  # a done job's reason may be an old requeue's: not worth saying
                bad = ended_badly(job_id, chunk, stream)
                err.write((bad or f"--- job {job_id} {chunk['state']} ---") + "\n")
                err.flush()
            return
        sleep(POLL_S)
