"""Commands that change pending jobs or the lab's rules: ``hold``, ``release``, ``priority``,
``limits``. Parsing and printing only; the daemon checks who may (``wire/rights.py``).

They read as Slurm's do: ``hold``/``release`` take ids, ranges and lists like ``scontrol
hold``; ``priority`` is ``scontrol update priority=``/``nice=`` in one; ``limits`` is what
``sacctmgr`` sets as ``MaxJobsPerUser`` and ``MaxTRESPerUser=gres/gpu``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from collocate.common.cli_options import FingerprintOpt, HostOpt, StateDirOpt, TokenFileOpt
from collocate.common.errors import CollocateError, InputError

IdsArg = Annotated[list[str], typer.Argument(metavar="IDS", help="Job ids, ranges and lists: 7, "
                                             "3-7, 3,5,9.", show_default=False)]


def _client(state_dir: Path | None, host: str | None = None, token_file: Path | None = None,
            fingerprint: str | None = None) -> Any:
    from collocate.client.connect import client_for

    return client_for(state_dir, host=host, token_file=token_file, fingerprint=fingerprint)


FormatOpt = Annotated[str, typer.Option("--format", help="table (for people) or json (for tools).")]


def _each(op: str, job_ids: list[str], target: tuple[Any, ...], fmt: str = "table", **args: Any) -> None:
    """Send ``op`` for every id; one line per job (``fmt`` json: one list at the end, refusals
    with their error), exit 1 if any was refused. ``target``: where the daemon is (``_client``'s
    arguments)."""
    from collocate.client.cli import _format
    from collocate.client.select import parse_ids
    from collocate.common.safetext import printable

    _format(fmt)
    client = _client(*target)
    failed = 0
    results: list[dict[str, Any]] = []
    for job_id in parse_ids(job_ids):
        try:
            r = client.request(op, id=job_id, **args)
        except CollocateError as exc:
            failed += 1
            results.append({"id": job_id, "error": str(exc.args[0]), "hint": exc.hint})
            what = {"hold": "not held", "release": "not released"}.get(op, "unchanged")
            typer.echo(f"{job_id}: {what}: {printable(exc, multiline=True)}", err=True)
            continue
        results.append(r)
        if fmt == "json":
            continue
        if op == "priority":
            typer.echo(f"{r['id']}: priority {r['priority']}")
        elif op in ("suspend", "resume_job"):
            typer.echo(f"{r['id']}: {r['state']}")
        else:
            typer.echo(f"{r['id']}: {'held' if r['held'] else 'released'}")
    if fmt == "json":
        typer.echo(json.dumps(results, indent=1))
    if failed:
        raise typer.Exit(1)


def suspend(job_ids: IdsArg, fmt: FormatOpt = "table", state_dir: StateDirOpt = None, host: HostOpt = None,
            token_file: TokenFileOpt = None, fingerprint: FingerprintOpt = None) -> None:
    """Freeze running jobs until `collocate resume ID` (your own; the daemon's owner may suspend
    anyone's), as Slurm's `scontrol suspend`: their processes stop (no CPU, no new GPU kernels),
    their GPU memory and GPUs stay theirs, and their --time does not run meanwhile. A job across
    nodes or an interactive job is never suspended."""
    _each("suspend", job_ids, (state_dir, host, token_file, fingerprint), fmt)


def resume_jobs(job_ids: list[str], target: tuple[Any, ...], fmt: str = "table") -> None:
    """Thaw suspended jobs (``collocate resume ID...``)."""
    _each("resume_job", job_ids, target, fmt)


def hold(job_ids: IdsArg, fmt: FormatOpt = "table", state_dir: StateDirOpt = None, host: HostOpt = None,
    token_file: TokenFileOpt = None, fingerprint: FingerprintOpt = None) -> None:
    """Keep pending jobs from starting until `collocate release` (your own; the daemon's owner
    may hold anyone's, and only they release such a hold)."""
    _each("hold", job_ids, (state_dir, host, token_file, fingerprint), fmt)


def release(job_ids: IdsArg, fmt: FormatOpt = "table", state_dir: StateDirOpt = None, host: HostOpt = None,
    token_file: TokenFileOpt = None, fingerprint: FingerprintOpt = None) -> None:
    """Let held jobs start again."""
    _each("release", job_ids, (state_dir, host, token_file, fingerprint), fmt)


def priority_(
    job_ids: IdsArg,
    value: Annotated[int, typer.Option("--set", help="The new priority (higher runs first, within "
                     "+/-1,000,000). You may lower your own jobs'; raising one is the daemon "
                     "owner's right.")],
    fmt: FormatOpt = "table",
    state_dir: StateDirOpt = None, host: HostOpt = None,
    token_file: TokenFileOpt = None, fingerprint: FingerprintOpt = None,
) -> None:
    """Change the priority of pending jobs: collocate priority 7 --set -10"""
    _each("priority", job_ids, (state_dir, host, token_file, fingerprint), fmt, priority=value)


def limits(
    user: Annotated[str | None, typer.Option("--user", "-u", help="Set this user's caps (else "
                    "the default every user without their own gets).")] = None,
    max_jobs: Annotated[int | None, typer.Option("--max-jobs", help="Most jobs one user may run "
                        "at once.")] = None,
    max_gpus: Annotated[int | None, typer.Option("--max-gpus", help="Most GPUs one user's running "
                        "jobs may hold at once.")] = None,
    max_cpu_jobs: Annotated[int | None, typer.Option("--max-cpu-jobs", help="Most CPU jobs "
                            "(--gpus 0) one user may run at once; they count against no other cap. "
                            "Default: the machine's cores.")] = None,
    clear: Annotated[bool, typer.Option("--clear", help="With --user: drop that user's own caps "
                     "(the default applies again); alone: drop the default caps. A cap not "
                     "given otherwise keeps its value.")] = False,
    fair_share: Annotated[str | None, typer.Option("--fair-share", help="on (the default): among "
                          "jobs of equal priority, the user with the least recent GPU time goes "
                          "first; off: first come, first served.")] = None,
    fmt: Annotated[str, typer.Option("--format", help="table (for people) or json (for tools).")] = "table",
    state_dir: StateDirOpt = None, host: HostOpt = None,
    token_file: TokenFileOpt = None, fingerprint: FingerprintOpt = None,
) -> None:
    """Show the per-user caps and fair share, or (the daemon's owner) set them.

    collocate limits --max-gpus 4               each user: 4 GPUs at most
    collocate limits --user alice --max-jobs 8  alice: her own caps
    collocate limits --user alice --clear       alice: the default again
    collocate limits --max-cpu-jobs 4           each user: 4 CPU jobs at most
    """
    from collocate.client.cli import _format

    _format(fmt)
    if fair_share not in (None, "on", "off"):
        raise InputError(f"--fair-share takes on or off, got {fair_share!r}")
    changing = (user is not None or max_jobs is not None or max_gpus is not None
                or max_cpu_jobs is not None or clear or fair_share)
    client = _client(state_dir, host, token_file, fingerprint)
    if changing:
        if user is not None and not (clear or max_jobs is not None or max_gpus is not None
                                     or max_cpu_jobs is not None):
            raise InputError("--user needs --max-jobs, --max-gpus, --max-cpu-jobs or --clear")
        current = client.request("limits")
        # a cap not given keeps its value: `--max-jobs 8` after `--max-gpus 4` keeps both
        now = current["default"] if user is None else current["users"].get(user, {})
        args: dict[str, Any] = {"user": user, "clear": clear,
                                "max_jobs": max_jobs if max_jobs is not None else now.get("max_jobs"),
                                "max_gpus": max_gpus if max_gpus is not None else now.get("max_gpus"),
                                "max_cpu_jobs": max_cpu_jobs if max_cpu_jobs is not None else now.get("max_cpu_jobs")}
        if clear:
            args.update(max_jobs=None, max_gpus=None, max_cpu_jobs=None)
        if fair_share is not None:
            args["fair_share"] = fair_share == "on"
        result = client.request("set_limits", **args)
    else:
        result = client.request("limits")
    if fmt == "json":
        typer.echo(json.dumps(result, indent=1))
        return
    _print_limits(result)


def _print_limits(r: dict[str, Any]) -> None:
    from collocate.common.safetext import printable

    def caps(lim: dict[str, Any]) -> str:
        parts = [f"{lim['max_jobs']} running jobs" if lim["max_jobs"] is not None else "",
                 f"{lim['max_gpus']} GPUs" if lim["max_gpus"] is not None else "",
                 f"{lim['max_cpu_jobs']} CPU jobs" if lim.get("max_cpu_jobs") is not None else ""]
        return "at most " + " and ".join(p for p in parts if p) if any(parts) else "no cap"

    typer.echo(f"fair share: {'on' if r['fair_share'] else 'off (first come, first served)'}"
               f" (usage half-life {r['half_life_s'] / 86400:g} days)")
    typer.echo(f"default per user: {caps(r['default'])}")
    if r.get("cpu_jobs_default") is not None and r["default"].get("max_cpu_jobs") is None:
        typer.echo(f"  CPU jobs (--gpus 0): at most {r['cpu_jobs_default']} per user (the machine's cores)")
    for user, lim in r["users"].items():
        typer.echo(f"{printable(user)}: {caps(lim)}")
    for user, u in r.get("usage", {}).items():
        typer.echo(f"  {printable(user) or '(daemon)'} runs {u['running_jobs']} job(s) on "
                   f"{u['running_gpus']} GPU(s); recent usage {u['gpu_hours']:.2f} GPU-hours")
