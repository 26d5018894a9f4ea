"""Tables for the client commands, kept apart from parsing so both stay short.

Everything a user or a job wrote (names, commands, paths, user names, reasons, which carry the
last line of a job's stderr) goes through ``safetext.printable`` and is printed as plain text,
never as Rich markup: see ``collocate.common.safetext`` for why. They are written by ``textout``, which
leaves to Rich only what has to wrap (importing Rich costs more than the rest of ``ls``).
"""

from __future__ import annotations

import shlex
import sys
import time
from typing import Any

from collocate.client.textout import Console, Table, Text
from collocate.common.safetext import printable
from collocate.common.units import format_duration, format_mib

NAME_WIDTH = 24
#: Below this many columns left for it, a REASON column would cut reasons to a word or two:
#: ``ls`` puts them under their rows, ``show`` under its attempts table, whole.
REASON_MIN = 24
ENDED = ("done", "failed", "cancelled", "rejected", "timeout")


def console() -> Console:
    """A console that reads no markup or emoji codes in what it prints, and does not squeeze
    tables to 80 columns when output is piped."""
    width = None if sys.stdout.isatty() else 200
    return Console(width=width, markup=False, emoji=False, highlight=False)


def plain(value: object, style: str = "") -> Text:
    """A table cell or line holding ``value`` exactly as written, control characters escaped."""
    return Text(printable(value), style=style)


def when(t: float | None) -> str:
    """A time with its date, as everywhere in the CLI: ``2026-11-24 14:03:12``."""
    return "-" if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def when_short(t: float | None) -> str:
    """The same in 11 characters for the narrow SUBMITTED column of ``ls``: ``11-24 14:03``
    this year, ``2025-12-30`` (the date alone) for an earlier one."""
    if t is None:
        return "-"
    local = time.localtime(t)
    same_year = local.tm_year == time.localtime().tm_year
    return time.strftime("%m-%d %H:%M" if same_year else "%Y-%m-%d", local)


def _mib(value: float | None) -> str:
    return "-" if value is None else format_mib(value)


def row_reason(r: dict[str, Any]) -> str:
    """Why a job waits (pending), is held (running, not launched yet) or ended (failed,
    cancelled, rejected); nothing for a done job, whose reason may be an old requeue's."""
    if r["state"] == "done":
        return ""
    return r.get("reason") or r.get("wait") or ""


def queue_order(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """As ``squeue`` lists them: running jobs, then pending ones in the order they would start
    (``position``; held and dependent ones, which have none, after), then ended ones."""
    def key(r: dict[str, Any]) -> tuple:
        group = {"running": 0, "pending": 1}.get(r["state"], 2)
        pos = r.get("position")
        return (group, pos is None, pos or 0, _id_key(r["id"]))
    return sorted(rows, key=key)


def _id_key(job_id: str) -> tuple[int, str]:
    return (int(job_id), job_id) if str(job_id).isdigit() else (1 << 62, str(job_id))


def job_time(r: dict[str, Any]) -> str:
    """squeue's TIME (how long it has run, time frozen left out as its ``--time`` leaves it
    out; ``0:00`` while pending), with the limit after a slash when it has one: ``12:03/30:00``."""
    elapsed = format_duration(max(0.0, (r.get("elapsed_s") or 0.0) - (r.get("frozen_s") or 0.0)))
    limit = r.get("time_limit_s")
    return elapsed if limit is None else f"{elapsed}/{format_duration(limit)}"


def cut_name(name: str, width: int) -> str:
    """A name cut to ``width``, keeping a sweep's values (``train.py[lr=0.1,seed=2]``): the
    part before ``[`` gives way first, then the values' start (the last axis, which varies
    fastest, is what tells a sweep's jobs apart)."""
    if len(name) <= width:
        return name
    base, bracket, label = name.partition("[")
    if bracket and len(label) + 2 < width:
        return base[: width - len(label) - 2] + "…[" + label
    if bracket:
        return "…" + name[-(width - 1):]
    return name[: width - 1] + "…"


def jobs_table(rows: list[dict[str, Any]], width: int, *, dated: bool = False) -> Table:
    """``collocate ls`` for a terminal ``width`` columns wide (120 reads well): every column
    keeps its width (NAME, USER and ON cut at 24, 12 and 12 characters) and REASON gets what is
    left, cut with an ellipsis; ``show`` or ``--format json`` give it whole, and the
    out-of-memory crashes counted in TRIES. Rows come in queue order (``queue_order``); with
    ended jobs, TIME is how long the last run took, ON its GPUs and EXIT its exit code
    (``sacct``'s Elapsed, NodeList, ExitCode; the wait is in ``--format json`` and the report).
    ``dated``: START and END too, END as its time of day alone when on START's day.

    A narrow terminal (80 columns), where REASON would get fewer than ``REASON_MIN`` columns
    and cut a reason to a word or two: ids, states, sizes, times and dates are never cut, the
    wordy columns narrow or go (``SHRINK``), and each job's reason is a line of its own under
    its row, wrapped at words (``textout.note_lines``)."""
    rows = queue_order(rows)
    ended = any(r["state"] in ENDED for r in rows)
    prio = any(r.get("priority") for r in rows)  # PRIO and EXIT only where they say something
    headers = ["ID", "NAME", "STATE", "USER", "GPUS", "MEM", *(["PRIO"] if prio else []), "TIME",
               "TRIES", "ON", *(["EXIT"] if ended else []), "SUBMITTED", *(["START", "END"] if dated else [])]
    cells = []
    for r in rows:
        row = [printable(r["id"]), cut_name(printable(r["name"]), NAME_WIDTH),
               "suspended" if r.get("suspended") else printable(r["state"]),
               printable(r["user"]), _gpus(r), _mib(r["mem_mib"]),
               *([str(r.get("priority", 0))] if prio else []),
               job_time(r), str(r["attempts"]), printable(",".join(r["on"]) or "-")]
        if ended:
            code = r.get("exit_code")
            row.append("-" if code is None else str(code))
        cells.append([*row, when_short(r["submit_time"]),
                      *([when_short(r.get("start_time")), end_short(r.get("start_time"), r.get("end_time"))]
                        if dated else [])])
    caps = {"NAME": NAME_WIDTH, "ON": 12, "USER": 12}
    widths = [min(max([len(h), *(len(row[i]) for row in cells)]), caps.get(h, 1 << 30))
              for i, h in enumerate(headers)]
    reasons = [printable(row_reason(r)) for r in rows]
    # REASON is the last column where narrowing NAME, ON and USER leaves it room for every
    # reason or REASON_MIN; else the wordy columns give way until the others fit (SHRINK: they
    # narrow, then SUBMITTED, TRIES, PRIO, ON and USER go, as sacct shows no user) and each
    # reason goes under its row, whole up to three lines (whole in `show`).
    want = max(len("REASON"), min(REASON_MIN, max(map(len, reasons), default=0)))
    narrowed = list(widths)
    _fit(headers, narrowed, [], [(h, least) for h, least in SHRINK if least], width - want - 1)
    beside = sum(narrowed) + len(narrowed) + want <= width
    if beside:
        widths = narrowed
    else:
        _fit(headers, widths, cells, SHRINK, width)
    left = width - sum(widths) - len(widths)
    table = Table(box=None, header_style="bold", pad_edge=False, padding=(0, 1, 0, 0),
                  note_indent=widths[0] + 1)
    for header, w in zip(headers, widths, strict=True):
        table.add_column(header, no_wrap=True, overflow="ellipsis", width=w, min_width=w)
    if beside:
        table.add_column("REASON", no_wrap=True, overflow="ellipsis", max_width=left)
    for row, reason in zip(cells, reasons, strict=True):
        row_cells = [Text(cut_name(c, w) if h == "NAME" else cut(c, w)) for c, w, h in zip(row, widths, headers, strict=True)]
        if beside:
            table.add_row(*row_cells, Text(cut(reason, left)))
        else:
            table.add_row(*row_cells, note=reason)
    return table


def _fit(headers: list[str], widths: list[int], cells: list[list[str]], steps: Any, limit: int) -> None:
    """Narrow or drop columns, in the order of ``steps`` (header, least width; 0: it goes),
    until they fit ``limit`` columns; a column is never widened (``cells``: the rows, whose
    cell of a dropped column goes with it)."""
    for header, least in steps:
        over = sum(widths) + len(widths) - 1 - limit
        if over <= 0 or header not in headers:
            continue
        i = headers.index(header)
        if least == 0:
            del headers[i], widths[i]
            for row in cells:
                del row[i]
        else:
            widths[i] = max(min(least, widths[i]), widths[i] - over)


def end_short(start: float | None, end: float | None) -> str:
    """``ls``'s END: its time of day alone (``09:40``) on its START's day, as a person reads a
    span (``11-29 08:12  09:40``); else as START (``when_short``)."""
    if end is None or start is None or time.localtime(start)[:3] != time.localtime(end)[:3]:
        return when_short(end)
    return time.strftime("%H:%M", time.localtime(end))


#: The columns of ``ls`` that narrow or go in a narrow terminal, in order, and their least width
#: (0: the column goes; `--format json` has them all); ID, STATE, GPUS, MEM, TIME, EXIT, START
#: and END never narrow.
SHRINK = (("NAME", 10), ("ON", 4), ("USER", 6), ("SUBMITTED", 0), ("TRIES", 0), ("PRIO", 0),
          ("ON", 0), ("USER", 0), ("NAME", 6))


def cut(text: str, width: int) -> str:
    """``text`` in at most ``width`` characters, ending in ``…`` where it was cut."""
    return text if len(text) <= width else text[: width - 1] + "…"


def print_jobs(rows: list[dict[str, Any]], *, dated: bool = False) -> None:
    """``ls``; ``dated`` (``--since``/``--until``): START and END columns too, as sacct's."""
    c = console()
    c.print(jobs_table(rows, c.width, dated=dated))


def print_detail(d: dict[str, Any], c: Console | None = None) -> None:
    """``collocate show``: one field a line, its value wrapped beside its name in a narrow
    terminal, then the attempts (``attempts_table``) and what was measured. Nothing is cut:
    this is where ``ls``'s shortened reasons are whole."""
    c = c or console()
    why = d["reason"] or d.get("wait") or ""
    reason = f" ({printable(why)})" if why else ""
    c.print(Text.assemble((f"job {printable(d['id'])}", "bold"),
                          f" {printable(d['name'])}: {d['state']}{reason}"))
    rows: list[tuple[str, str]] = []
    if "argv" in d:  # quoted as a shell would need it: copy, paste, run
        rows += [("command", printable(shlex.join(d["argv"]))), ("cwd", printable(d["cwd"]))]
    else:
        rows.append(("command", "(only its owner sees it; `collocate submit --public` shares it)"))
    rows.append(("user", printable(d["user"])))
    rows.append(("gpus", f"{_gpus(d)}   memory {requirement(d)}   priority {d.get('priority', 0)}"))
    if d.get("profile"):
        p = d["profile"]
        rows.append(("activity", activity_text(p, d.get("summary"))))
        if isinstance(p.get("measured_slowdown"), (int, float)):
            rows.append(("slowdown", f"{p['measured_slowdown']:.2f}x now, from the steps it reports"))
    rows.append(("retries", retries_line(d)))
    if d.get("fence"):
        rows.append(("memory", printable(d["fence"])))
    if d.get("victim_crashes"):
        rows.append(("crashed", f"{d['victim_crashes']} time(s) out of memory because a neighbour "
                     "overran; not counted, requirement unchanged"))
    for key, what in (("after", "must end done first"), ("after_any", "must end first"),
                      ("after_notok", "must end other than done first")):
        if d.get(key):
            rows.append((key.replace("_", "-"), f"job(s) {printable(', '.join(d[key]))} ({what})"))
    if d.get("time_limit_s") is not None:
        rows.append(("time", f"limit {format_duration(d['time_limit_s'])}"))
    if d.get("suspended"):
        by = {"user": "its owner", "preempt": "the scheduler (preemption)"}.get(d["suspended"], "the scheduler")
        rows.append(("suspended", f"by {by} since {when(d.get('suspended_at'))}: "
                     f"{printable(d.get('suspended_why') or '')}"
                     + (f"; `collocate resume {printable(d['id'])}`" if d["suspended"] == "user" else "")))
    if d.get("held"):
        by = "the daemon's owner" if d["held"] == "admin" else "its owner"
        rows.append(("held", f"by {by}: `collocate release {printable(d['id'])}`"))
    if d.get("notify"):
        rows.append(("notify", printable(shlex.join(d["notify"]))))
    if d.get("output"):
        rows.append(("output", printable(d["output"]) + ("" if d.get("error") else " (stdout and stderr)")))
    if d.get("error"):
        rows.append(("error", printable(d["error"])))
    if d.get("sweep"):
        most = f" (at most {d['sweep_max']} of it at once)" if d.get("sweep_max") else ""
        rows.append(("sweep", f"{printable(d['sweep'])}{most}"))
    rows.append(("submitted", f"{when(d['submit_time'])}   ended {when(d['end_time'])}"))
    if not d["attempts"]:
        rows.append(("attempts", "none yet"))  # not a table's header over nothing
    c.print(fields(rows, indent=2))
    if d["attempts"]:
        attempts = attempts_table(d["attempts"], c.width)
        c.print(attempts)
        reasons = [(f"reason #{a['n']}", printable(a["reason"])) for a in d["attempts"] if a["reason"]]
        if attempts.columns[-1].header != "REASON" and reasons:  # no room beside: whole, under it
            c.print(fields(reasons, indent=2))
    measured = measured_lines(d.get("summary"))
    if measured:  # "  label" + value, summary_lines' labels padded to 17 characters
        c.print(measured[0])
        c.print(fields([(line[2:19].strip(), line[19:]) for line in measured[1:]], indent=2))


def requirement(d: dict[str, Any]) -> str:
    """The memory a job is charged per GPU and where that figure comes from; a job that gave
    none says so rather than ``- (unknown)`` beside the peak measured below."""
    if d["mem_mib"] is None:
        return "not given (it is charged what it holds)"
    return f"{_mib(d['mem_mib'])} ({printable(d['mem_source'])})"


def fields(rows: list[tuple[str, str]], *, indent: int) -> Table:
    """``name  value`` lines whose values wrap beside their names (never under them), words
    whole; a word longer than the line (a path) is folded rather than cut."""
    keys = [" " * indent + k for k, _ in rows]
    grid = Table.grid(padding=(0, 1), pad_edge=False)
    grid.add_column(no_wrap=True, min_width=max([indent + 9, *map(len, keys)]))
    grid.add_column(overflow="fold")
    for key, (_, value) in zip(keys, rows, strict=True):
        grid.add_row(Text(key), Text(value))
    return grid




def attempts_table(attempts: list[dict[str, Any]], width: int) -> Table:
    """``show``'s attempts for a terminal ``width`` columns wide: no cell is ever cut. Dates
    keep their day below 120 columns (``11-24 14:03``); the GPUs fold between ids; REASON is a
    column while it has room (``REASON_MIN``), else ``print_detail`` puts them under it."""
    short = width < 120
    on = [", ".join(a["gpus"]) or (f"cpu on {a['host']}" if a.get("host") else "cpu") for a in attempts]
    cells = [[str(a["n"]), (when_short if short else when)(a["start"]), (when_short if short else when)(a["end"]),
              _mib(a["mem_mib"]), _mib(a["peak_mib"]) + (" so far" if a.get("peak_so_far") else ""),
              "-" if a["returncode"] is None else str(a["returncode"]), printable(a["outcome"] or "running")]
             for a in attempts]
    heads = ("#", "START", "END", "MEM", "PEAK", "EXIT", "OUTCOME")
    widths = [max([len(h), *(len(row[i]) for row in cells)]) for i, h in enumerate(heads)]
    gpu_width = max([3, *(len(g) for a in attempts for g in a["gpus"]), *(len(o) for o in on if "," not in o)])
    gpu_width = max(gpu_width, min(max([3, *map(len, on)]), width - sum(widths) - len(widths) - 1 - REASON_MIN))
    left = width - sum(widths) - gpu_width - len(widths) - 1
    table = Table(box=None, header_style="bold", title="attempts", title_justify="left", pad_edge=False,
                  padding=(0, 1, 0, 0))
    for h, w in zip(heads[:3], widths[:3], strict=True):
        table.add_column(h, no_wrap=True, min_width=w)
    table.add_column("GPU", min_width=gpu_width, max_width=gpu_width)  # wraps between ", "
    for h, w in zip(heads[3:], widths[3:], strict=True):
        table.add_column(h, no_wrap=True, min_width=w)
    with_reasons = left >= REASON_MIN
    if with_reasons:
        table.add_column("REASON", overflow="fold", max_width=left)
    for row, gpus, a in zip(cells, on, attempts, strict=True):
        table.add_row(*row[:3], plain(gpus), *row[3:], *([plain(a["reason"] or "")] if with_reasons else []))
    return table


def activity_text(profile: dict[str, Any], summary: dict[str, Any] | None) -> str:
    """The solo activity the scheduler uses, labelled measured or assumed; an assumption is not
    printed beside a measurement of the job (its mean SM over the run, in "measured" below)."""
    alone = (f"SM {profile['sm_activity']:.2f}, DRAM {profile['dram_activity']:.2f} alone"
             f" ({printable(profile['source'])})")
    if profile.get("source_kind") == "assumed" and (summary or {}).get("mean_sm") is not None:
        return ("never measured alone (it always shared its GPU); what was measured is its mean "
                "SM activity, under \"measured\" below")
    return alone


def retries_line(d: dict[str, Any]) -> str:
    """How many attempts a job used, and what would be retried: out-of-memory crashes up to
    ``max_retries`` times, other failures only when the user asked (``--retries``)."""
    used, most, ooms = d["attempts_used"], d["max_retries"], d["oom_crashes"]
    crashes = f", {ooms} out-of-memory crash(es)" if ooms else ""
    if d.get("retry_failures"):
        return f"{used} attempt(s) of {most + 1} allowed (failures and out-of-memory crashes are retried){crashes}"
    return (f"{used} attempt(s){crashes}; out-of-memory crashes are retried up to {most} time(s), "
            "other failures are not (`--retries N` retries them)")


def measured_lines(summary: dict[str, Any] | None) -> list[str]:
    """``collocate show``'s "measured" block from the monitoring store's ``JobSummary`` dict."""
    if not summary:
        return []
    from collocate.monitor.report import summary_lines
    from collocate.monitor.store import JobSummary

    fields = {k: summary[k] for k in JobSummary.__slots__ if k in summary}
    try:
        s = JobSummary(**{**fields, "gpus": tuple(summary.get("gpus", ()))})
    except TypeError:  # a daemon of another version: show nothing rather than fail
        return []
    return ["measured", *(f"  {line}" for line in summary_lines(s))]


def tracking_line(ping: dict[str, Any]) -> str | None:
    """"tracking degraded: mlflow (reason)" when a monitoring sink is failing, else None."""
    bad = [t for t in ping.get("tracking", []) if t.get("degraded")]
    if not bad:
        return None
    return printable("tracking degraded: " + "; ".join(
        f"{t['sink']} ({t.get('reason') or 'unknown'}; {t.get('pending', 0)} pending, "
        f"{t.get('dropped', 0)} dropped, retry in {t.get('retry_in_s', 0):.0f} s)" for t in bad))


def gpu_table(rows: list[dict[str, Any]]) -> Table:
    """``collocate gpus``: per GPU what its processes hold (USED), what its jobs are charged
    (COMMITTED: a declared or estimated requirement counts from placement, before the job
    allocates it) and the ROOM placement can still give, the smaller of free and uncommitted
    memory: the number a pending job's "most room" reason quotes, before the policy's margins."""
    table = Table(box=None, header_style="bold", pad_edge=False, padding=(0, 1, 0, 0))
    # In 80 columns nothing is cut or wrapped but the job list, which folds onto more lines
    for col in ("GPU", "TYPE", "USED", "COMMITTED", "ROOM", "TOTAL", "SM NOW", "SM WINDOW"):
        table.add_column(col, no_wrap=True)
    table.add_column("JOBS", overflow="fold", min_width=4)
    for i, r in enumerate(rows):
        if i and r.get("node") != rows[i - 1].get("node"):
            table.add_row()  # a cluster's GPUs, grouped by node
        sm = "-" if r["sm_now"] is None else f"{r['sm_now'] * 100:.0f}%"
        reachable = r.get("reachable", True)
        used = _mib(r["used_mib"]) if reachable else "node away"
        committed = r.get("committed_mib") or 0.0
        free = r["total_mib"] if r.get("free_mib") is None else r["free_mib"]
        room = max(0.0, min(free, r["total_mib"] - committed)) if reachable else None
        table.add_row(plain(r["id"]), plain(r["type"]), used, _mib(committed), _mib(room),
                      _mib(r["total_mib"]), sm, f"{r['sm_window'] * 100:.0f}%",
                      plain(", ".join(r["jobs"]) or "-"))
    events = {(r["node"], e[0], e[1]) for r in rows if (e := r.get("node_event"))}
    if events:  # a cluster's membership: nodes that joined, left or came back lately
        table.caption = "; ".join(f"{printable(node)} {printable(what)} {format_duration(time.time() - at)} ago"
                                  for node, at, what in sorted(events, key=lambda e: -e[1]))
        table.caption_justify = "left"
    return table


def _gpus(row: dict[str, Any]) -> str:
    """A job's GPUs: ``2``, or ``4x2`` (4 on each of 2 nodes) for a job on several nodes;
    ``cpu`` for a CPU job (``--gpus 0``)."""
    if row["gpus"] == 0:
        return "cpu"
    nodes = row.get("nodes", 1) or 1
    return f"{row['gpus']}x{nodes}" if nodes > 1 else str(row["gpus"])
