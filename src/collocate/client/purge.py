"""``collocate purge``: remove ended jobs' stored logs, so that a member at their storage quota
frees it themselves instead of asking the daemon's owner (issue 36).

Slurm has no twin (its logs are the user's own files); this is the closest to deleting them.
The job's record stays (``ls --all``, ``show``, ``sacct``-like history); its attempts' stdout
and stderr and its ``--notify`` output go. Who may purge is ``cancel``'s rule (the job's owner
or the daemon's owner), checked and audited by the daemon (``wire/rights.py``).
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Annotated, Any

import typer

from collocate.common.cli_help import help_text
from collocate.common.cli_options import FingerprintOpt, HostOpt, StateDirOpt, TokenFileOpt
from collocate.common.errors import CollocateError, InputError


def register(app: typer.Typer) -> None:
    app.command("purge", help=help_text(purge))(purge)


def purge(
    job_ids: Annotated[list[str] | None, typer.Argument(metavar="[IDS]", help="Ended jobs' ids, "
                       "ranges and lists: 7, 3-7, 3,5,9.", show_default=False)] = None,
    before: Annotated[str | None, typer.Option("--before", help="Every job of yours that ended "
                      "before this date or time (local), e.g. 2026-01-31 or 2026-01-31T18:00; "
                      "`now`: every ended job of yours.")] = None,
    fmt: Annotated[str, typer.Option("--format", help="table (for people) or json (for tools).")] = "table",
    state_dir: StateDirOpt = None, host: HostOpt = None,
    token_file: TokenFileOpt = None, fingerprint: FingerprintOpt = None,
) -> None:
    """Remove the stored logs of ended jobs, freeing your storage quota: collocate purge 12 14-20

    Their records stay (`collocate ls --all`, `show`); their output and --notify output go.
    A pending or running job's logs are never removed; another member's jobs are theirs.

    collocate purge --before 2026-01-31 removes those of every job of yours that ended before.
    """
    from collocate.client.cli import _format
    from collocate.client.connect import client_for
    from collocate.client.select import parse_ids
    from collocate.common.safetext import printable

    _format(fmt)
    if bool(job_ids) == (before is not None):
        raise InputError("give job ids or --before, one of the two",
                         hint="collocate purge 12 14-20, or collocate purge --before 2026-01-31")
    client = client_for(state_dir, host=host, token_file=token_file, fingerprint=fingerprint)
    if before is not None:
        result = client.request("purge", before=_when(before))
        if fmt == "json":
            typer.echo(json.dumps(result, indent=1))
        else:
            typer.echo(f"purged the logs of {len(result['purged'])} jobs ({_size(result['freed'])} freed)")
        return
    results: list[dict[str, Any]] = []
    failed = 0
    for job_id in parse_ids(job_ids or []):
        try:
            r = client.request("purge", id=job_id)
        except CollocateError as exc:
            failed += 1
            results.append({"id": job_id, "error": str(exc.args[0]), "hint": exc.hint})
            typer.echo(f"{job_id}: not purged: {printable(exc, multiline=True)}", err=True)
            continue
        results.append({"id": job_id, "freed": r["freed"]})
        if fmt == "table":
            typer.echo(f"{job_id}: logs purged ({_size(r['freed'])} freed)")
    if fmt == "json":
        typer.echo(json.dumps(results, indent=1))
    if failed:
        raise typer.Exit(1)


def _when(text: str) -> float:
    """``--before``: ``now``, or an ISO date or date and time (local unless it says its zone)."""
    if text.strip().lower() == "now":
        return datetime.now().timestamp()
    try:
        return datetime.fromisoformat(text.strip()).timestamp()
    except ValueError:
        raise InputError(f"--before takes a date or time, got {text!r}",
                         hint="e.g. --before 2026-01-31, --before 2026-01-31T18:00, or --before now") from None


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 1024:.0f} KiB" if n >= 1024 else f"{n} bytes"

