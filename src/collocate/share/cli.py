"""`collocate share serve|status`: run a shared producer from the command line."""

from __future__ import annotations

import typer

share_app = typer.Typer(help="Shared data loading: one input pipeline, many training jobs.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(share_app, name="share")


@share_app.command("serve")
def serve_command(
    factory: str = typer.Argument(..., help="module:callable returning a DataLoader (or any iterable of batches)"),
    name: str = typer.Option(..., "--name", help="dataset name consumers pass to SharedLoader"),
    slots: int = typer.Option(8, help="ring slots: how far the fastest consumer may run ahead of the slowest"),
    stall_timeout: float = typer.Option(10.0, help="seconds the slowest consumer may hold everyone back"),
    consumer_timeout: float = typer.Option(5.0, help="seconds of silence before a consumer is detached"),
    samples_per_epoch: int | None = typer.Option(None, help="for len() when the loader cannot say"),
    state_dir: str | None = typer.Option(None, help="namespace of producer names (default: per user)"),
    device: str = typer.Option("cpu", help="cpu, or a CUDA device for the (untested) CUDA IPC ring"),
) -> None:
    """Serve a loader's batches to every `SharedLoader(NAME)` on this host until SIGTERM/Ctrl-C."""
    import logging

    from collocate.share.factory import build_loader
    from collocate.share.producer import serve

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    loader = build_loader(factory)
    typer.echo(f"serving {factory} as {name!r} (Ctrl-C to stop)", err=True)
    stats = serve(loader, name, slots=slots, stall_timeout_s=stall_timeout, consumer_timeout_s=consumer_timeout,
                  samples_per_epoch=samples_per_epoch, state_dir=state_dir, device=device)
    typer.echo(f"stopped {name!r}: {stats['batches']} batches, {stats['samples']} samples, "
               f"{stats['detached']} consumers detached", err=True)


@share_app.command("status")
def status_command(
    name: str = typer.Argument(..., help="dataset name"),
    state_dir: str | None = typer.Option(None, help="namespace of producer names (default: per user)"),
    fmt: str = typer.Option("table", "--format", help="table (for people) or json (for tools: null "
                            "when none serves it)."),
) -> None:
    """Show whether a producer serves NAME, and its progress (exit 1 if none does)."""
    from collocate.common.errors import InputError
    from collocate.share.lifecycle import probe

    if fmt not in ("table", "json"):
        raise InputError(f"unknown --format {fmt!r}", hint="use table or json")
    status = probe(name, state_dir)
    if fmt == "json":
        import dataclasses
        import json

        typer.echo(json.dumps(None if status is None else dataclasses.asdict(status), indent=1))
    if status is None:
        if fmt != "json":
            typer.echo(f"no producer serves {name!r}")
        raise typer.Exit(1)
    if fmt == "json":
        return
    typer.echo(f"{status.name}: pid {status.pid}, {'ready' if status.ready else 'starting'}, "
               f"{status.consumers} consumers, {status.batches} batches / {status.samples} samples served"
               + (f", error: {status.error}" if status.error else ""))
