"""`collocate estimate`: GPU memory of a training job before it runs.

torch is imported only inside the command, so ``collocate --help`` stays fast.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Annotated, Any

import typer

from collocate.common.errors import InputError
from collocate.estimate.base import Estimate

#: Show the expandable-segments tip when it would save at least 10%.
EXPANDABLE_HINT = 0.9


def expandable_tip_mib(est: Estimate) -> float | None:
    """What the job would need with expandable segments, when that saves enough to say so."""
    expandable = est.details.get("expandable_mib")
    return expandable if expandable is not None and expandable < EXPANDABLE_HINT * est.mib else None


def register(app: typer.Typer) -> None:
    app.command("estimate")(estimate)


def estimate(
    entry_point: Annotated[str, typer.Argument(help="package.module:function returning (model, batch, optimizer[, loss])")],
    batch_size: Annotated[int, typer.Option("--batch-size", "-b", help="per-GPU batch size")],
    optimizer: Annotated[str | None, typer.Option(help="sgd, adam or adamw (default: the entry point's)")] = None,
    precision: Annotated[str, typer.Option(help="fp32, fp16 (AMP) or bf16 (AMP)")] = "fp32",
    gpu: Annotated[str | None, typer.Option(help="GPU type, e.g. A100-40GB, H100-80GB")] = None,
    fmt: Annotated[str, typer.Option("--format", help="table or json")] = "table",
    fallback: Annotated[str, typer.Option(help="comma-separated fallbacks to allow, or 'none'")] = "cpu-run,analytical",
    baselines: Annotated[bool, typer.Option("--baselines", help="also print the Horus and FakeTensor baselines")] = False,
    allocator: Annotated[str | None, typer.Option(
        help="PyTorch allocator mode of the job: default or expandable (expandable_segments:True). "
             "Default: read from PYTORCH_CUDA_ALLOC_CONF here")] = None,
    cold: Annotated[bool, typer.Option("--cold", help="Estimate in this process even when the "
                    "daemon keeps a warm estimator (it does by default): same numbers, slower")] = False,
) -> None:
    """Estimate the peak GPU memory of one training iteration (no GPU needed)."""
    if fmt not in ("table", "json"):
        raise InputError(f"unknown format {fmt!r}", hint="use --format table or --format json")
    from collocate.estimate.api import estimate_baselines, estimate_memory
    from collocate.estimate.gpu_overheads import allocator_from_conf

    if allocator is None:
        allocator = allocator_from_conf(os.environ.get("PYTORCH_CUDA_ALLOC_CONF"))

    fallbacks = () if fallback.strip() in ("", "none") else tuple(
        f.strip() for f in fallback.split(",") if f.strip()
    )
    request: dict[str, Any] = dict(entry_point=entry_point, batch_size=batch_size, optimizer=optimizer,
                   precision=precision, gpu=gpu, fallbacks=fallbacks, allocator=allocator)
    est = None if cold or baselines else _ask_warm(request)
    if est is None:
        est = estimate_memory(**request)
    base = estimate_baselines(entry_point, batch_size=batch_size, precision=precision) if baselines else {}
    if fmt == "json":
        out = est.to_dict()
        if baselines:
            out["baselines"] = {k: (v.to_dict() if not isinstance(v, str) else {"error": v})
                                for k, v in base.items()}
        typer.echo(json.dumps(out, indent=2))
        return
    _print_table(est, base)


def _ask_warm(request: dict[str, Any]) -> Estimate | None:
    """The daemon's warm estimator's answer (``estimate/warm.py``), or None: estimate here."""
    from collocate.estimate.warm import ask
    from collocate.wire.paths import StateLayout, client_state_dir

    return ask(StateLayout(client_state_dir()).estimator_socket, **request)


def _print_table(est: Estimate, base: Mapping[str, Estimate | str]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    allocator = est.details.get("allocator")
    console.print(f"estimated peak GPU memory: [bold]{est.mib:,.0f} MiB[/bold] "
                  f"(±{est.uncertainty:.0%}, method: {est.method}"
                  + (f", {allocator} allocator" if allocator else "") + ")")
    t = Table()
    t.add_column("part")
    t.add_column("MiB", justify="right")
    for k, v in est.breakdown.items():
        t.add_row(k.replace("_", " "), f"{v:,.1f}")
    console.print(t)
    if est.note:
        console.print(f"note: {est.note}")
    expandable = expandable_tip_mib(est)
    if expandable is not None:
        console.print(f"tip: with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True this job would "
                      f"need about {expandable:,.0f} MiB ({expandable / est.mib - 1:.0%}): less "
                      "allocator fragmentation (docs/estimator.md)")
    for name, b in base.items():
        text = f"{b.mib:,.0f} MiB" if isinstance(b, Estimate) else f"failed ({b})"
        console.print(f"baseline {name}: {text}")
