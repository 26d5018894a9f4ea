"""``collocate report`` and ``collocate dashboard``: parsing and printing, the work elsewhere."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from collocate.common.cli_help import help_text
from collocate.common.errors import CollocateError, InputError

StateDirOpt = Annotated[Path | None, typer.Option(
    "--state-dir", readable=False, help="Daemon state dir (default: $COLLOCATE_STATE_DIR, then "
    "$XDG_STATE_HOME/collocate, then ~/.local/state/collocate).")]


def register(app: typer.Typer) -> None:
    app.command("report")(report)
    app.command("dashboard", help=help_text(dashboard))(dashboard)


def report(
    since: Annotated[str | None, typer.Option(
        "--since", help="Only after this: 24h, 7d, 2026-11-20T08:00, or epoch seconds.")] = None,
    state_dir: Annotated[Path | None, typer.Option(
        "--state-dir", help="Daemon state dir (default: $COLLOCATE_STATE_DIR, then "
        "$XDG_STATE_HOME/collocate, then ~/.local/state/collocate).")] = None,
    out: Annotated[Path, typer.Option("--out", help="Directory for summary.md/json and PNGs.")]
    = Path("collocate-report"),
    fmt: Annotated[str, typer.Option("--format", help="table: a line, then the files written; "
                   "json: summary.json's object, with the files written in \"files\".")] = "table",
) -> None:
    """Summarise GPU usage per user, job and GPU (energy, GPU-hours, SM activity) with plots."""
    from collocate.monitor.report import build_report, parse_since
    from collocate.monitor.store import MonitorStore, monitor_db_path
    from collocate.wire.paths import resolve_state_dir

    if fmt not in ("table", "json"):
        raise InputError(f"unknown --format {fmt!r}", hint="use table or json")
    start = parse_since(since) if since else None
    path = monitor_db_path(resolve_state_dir(state_dir))
    if not path.exists():
        raise CollocateError(
            f"no monitoring data at {path}",
            hint="run the daemon (`collocate serve`) so it samples, or pass its --state-dir",
        )
    store = MonitorStore(path)
    try:
        result = build_report(store, out, since=start, accounting=_accounting(path.parent))
    finally:
        store.close()
    if fmt == "json":
        import json

        summary = json.loads((out / "summary.json").read_text())
        typer.echo(json.dumps({**summary, "files": [str(f) for f in result.files]}, indent=1))
        return
    typer.echo(f"{len(result.jobs)} job(s), {len(result.users)} user(s), "
               f"{len(result.gpus)} GPU(s); energy {sum(j.energy_wh for j in result.jobs):.2f} Wh "
               f"attributed to jobs")
    for f in result.files:
        typer.echo(f"wrote {f}")


def _accounting(state_dir: Path) -> list[dict] | None:
    """Every job as ``sacct`` shows it (state, exit code, GPUs, wait, run time), from the job
    store read-only; None where there is none to read."""
    from collocate.daemon.store import Store
    from collocate.daemon.views import job_rows

    try:
        store = Store.read_only(state_dir / "collocate.common.sqlite")
    except CollocateError:
        return None
    try:
        running = {job.id: None for job, _, _ in store.jobs() if job.state.value == "running"}
        return job_rows(store, include_done=True, running=running)
    finally:
        store.close()


def dashboard(
    state_dir: StateDirOpt = None,
    host: Annotated[str, typer.Option("--host", help="Address to serve on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="Port (0 picks a free one). Not 8765, the "
                     "daemon's own dashboard's (`collocate serve --dashboard 8765`, the lab unit's).")] = 8390,
    token_file: Annotated[Path | None, typer.Option(
        "--token-file", help="File holding the access token (default: the daemon's, kept in "
        "<state>/dashboard.token, when you own the state dir; else a new random one, printed in "
        "the URL).")] = None,
    no_token: Annotated[bool, typer.Option(
        "--no-token", help="Serve without a token (localhost only): any local user can then read "
        "every job's command and logs.")] = False,
    allow_submit: Annotated[bool, typer.Option(
        "--allow-submit", help="Let the page queue jobs (as you; needs a token).")] = False,
) -> None:
    """Serve the web dashboard of a running daemon until Ctrl-C; open the URL it prints.

    Anyone the daemon serves may run their own: it acts with their rights (their jobs in full,
    with cancel, hold and release; others' as `collocate ls` shows them), reads everything
    through the daemon's API, and needs no access to the state dir."""
    import os
    import secrets
    import signal
    import threading

    from collocate.client.connect import Client
    from collocate.common.errors import InputError
    from collocate.daemon.tracking import check_dashboard, stable_token
    from collocate.web.app import create_app
    from collocate.web.client_source import ClientSource
    from collocate.web.server import serve_in_thread
    from collocate.wire.paths import StateLayout, resolve_state_dir

    if no_token and token_file is not None:
        raise InputError("give either --token-file or --no-token, not both")
    check_dashboard((host, port), not no_token)
    if allow_submit and no_token:
        raise InputError("--allow-submit needs a token",
                         hint="anyone who can open the page could queue jobs as you otherwise")
    root = resolve_state_dir(state_dir)
    client = Client(root)
    client.request("ping")  # a clear error now if no daemon runs there
    token = None
    if token_file is not None:
        token = token_file.read_text().strip()
    elif not no_token and root.stat().st_uid == os.getuid():
        token = stable_token(StateLayout(root).dashboard_token)  # the same across restarts
    elif not no_token:
        token = secrets.token_urlsafe(32)
    server = serve_in_thread(create_app(ClientSource(client, allow_submit=allow_submit), token=token),
                             host, port)
    stop = threading.Event()  # before the URL is printed: a stop request may follow it at once
    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGINT, signal.SIGTERM)}
    if token is None:
        typer.echo(f"dashboard on {server.url} (no token)", err=True)
    elif token_file is None:
        typer.echo(f"dashboard on {server.url}?token={token}", err=True)
    else:
        typer.echo(f"dashboard on {server.url}?token=<the token in {token_file}>", err=True)
    try:
        while not stop.wait(0.5):
            pass
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        server.stop()
