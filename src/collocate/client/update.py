"""``collocate update``: change a pending job, as ``scontrol update`` does.

Memory (a declaration from then on), time limit, name, dependencies and niceness, with
``priority``'s rights: a member changes their own jobs and may only lower a priority. A running
job keeps what it started with; the daemon refuses and says so.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from collocate.client.control import IdsArg
from collocate.common.cli_options import FingerprintOpt, HostOpt, StateDirOpt, TokenFileOpt
from collocate.common.errors import CollocateError, InputError


def update(
    job_ids: IdsArg,
    mem: Annotated[str | None, typer.Option("--mem", help="GPU memory per GPU, with a unit "
                   "(6GiB); it becomes the job's declared requirement.")] = None,
    time_limit: Annotated[str | None, typer.Option("--time", "-t", help="New time limit, as "
                          "submit reads it (30, 2:00:00, 1-00:00:00, 2h).")] = None,
    name: Annotated[str | None, typer.Option("--name", help="New name.")] = None,
    after: Annotated[list[str] | None, typer.Option("--after", help="Replace its --after "
                     "dependencies with these job ids (repeatable; --after '' clears them).")] = None,
    after_any: Annotated[list[str] | None, typer.Option("--after-any", help="Replace its "
                         "--after-any dependencies (repeatable; '' clears).")] = None,
    after_notok: Annotated[list[str] | None, typer.Option("--after-notok", help="Replace its "
                           "--after-notok dependencies (repeatable; '' clears).")] = None,
    nice: Annotated[int | None, typer.Option("--nice", help="Set its priority to -N "
                    "(0 to 1,000,000): let other jobs go first.")] = None,
    priority: Annotated[int | None, typer.Option("--priority", help="Set its priority (raising "
                        "one is the daemon owner's right).")] = None,
    fmt: Annotated[str, typer.Option("--format", help="table (for people) or json (for tools).")] = "table",
    state_dir: StateDirOpt = None, host: HostOpt = None,
    token_file: TokenFileOpt = None, fingerprint: FingerprintOpt = None,
) -> None:
    """Change pending jobs: collocate update 7 --mem 12GiB --time 4:00:00 --after 5

    Only a pending (or held) job changes; a running one keeps what it started with.
    """
    from collocate.client.cli import _format
    from collocate.client.control import _client
    from collocate.client.select import parse_ids
    from collocate.common.safetext import printable
    from collocate.common.units import parse_duration, require_unit

    _format(fmt)
    if nice is not None and priority is not None:
        raise InputError("give --priority or --nice, not both", hint="--nice N is --priority -N")
    if nice is not None and not 0 <= nice <= 1_000_000:
        raise InputError(f"--nice takes 0 to 1,000,000, got {nice}")
    if mem is not None:
        require_unit(mem, "--mem")
    if time_limit is not None:
        parse_duration(time_limit)
    changes: dict[str, Any] = {"mem": mem, "time": time_limit, "name": name,
                               "priority": -nice if nice is not None else priority}
    for key, values in (("after", after), ("after_any", after_any), ("after_notok", after_notok)):
        if values is not None:
            changes[key] = parse_ids(values)
    if all(v is None for v in changes.values()):
        raise InputError("nothing to change", hint="give --mem, --time, --name, --after, "
                         "--after-any, --after-notok, --nice or --priority")
    client = _client(state_dir, host, token_file, fingerprint)
    results, failed = [], 0
    for job_id in parse_ids(job_ids):
        try:
            r = client.request("update", id=job_id, **changes)
        except CollocateError as exc:
            failed += 1
            results.append({"id": job_id, "error": str(exc.args[0]), "hint": exc.hint})
            typer.echo(f"{job_id}: unchanged: {printable(exc, multiline=True)}", err=True)
            continue
        results.append(r)
        if fmt == "table":
            typer.echo(f"{printable(r['id'])}: {_describe(r)}")
    if fmt == "json":
        typer.echo(json.dumps(results, indent=1))
    if failed:
        raise typer.Exit(1)


def _describe(r: dict[str, Any]) -> str:
    from collocate.common.safetext import printable
    from collocate.common.units import format_duration, format_mib

    said = {"name": f"name {printable(r['name'])}",
            "mem_mib": f"memory {format_mib(r['mem_mib'])}" if r["mem_mib"] is not None else "",
            "time_limit_s": f"time limit {format_duration(r['time_limit_s'])}"
            if r["time_limit_s"] is not None else "time limit none",
            "priority": f"priority {r['priority']}",
            "after": "after " + (", ".join(r["after"]) or "none"),
            "after_any": "after-any " + (", ".join(r["after_any"]) or "none"),
            "after_notok": "after-notok " + (", ".join(r["after_notok"]) or "none")}
    parts = [said[c] for c in r["changed"] if said.get(c)]
    waits = f" ({printable(r['reason'])})" if r.get("reason") else ""
    return "; ".join(parts) + waits
