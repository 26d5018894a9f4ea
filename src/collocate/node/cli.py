"""`collocate emulate-job`: run an emulated training job on emulated GPUs (demos, tests, CI)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from collocate.common.cli_help import help_text


def register(app: typer.Typer) -> None:
    app.command("emulate-job", help=help_text(emulate_job))(emulate_job)


def emulate_job(
    mem: Annotated[str, typer.Option("--mem", help="GPU memory the job uses, e.g. 3GiB, 512MiB.")],
    seconds: Annotated[float, typer.Option("--seconds", help="Duration when alone on a GPU.")],
    sm: Annotated[float, typer.Option("--sm", help="Solo SM activity, fraction in [0, 1].")] = 0.5,
    dram: Annotated[float, typer.Option("--dram", help="Solo DRAM activity, fraction.")] = 0.2,
    ramp: Annotated[
        float, typer.Option("--ramp", help="Seconds to grow to --mem (4 steps) after start-up.")
    ] = 2.0,
    startup: Annotated[
        float, typer.Option("--startup", help="Seconds of start-up first (imports, model "
                                              "construction): no GPU memory, no activity.")
    ] = 0.0,
    warmup: Annotated[
        float, typer.Option("--warmup", help="Seconds after start-up of first steps: memory "
                                             "held, no activity yet.")
    ] = 0.0,
    steps_per_s: Annotated[
        float, typer.Option("--steps-per-s", help="Training steps a second when alone, reported "
                                                  "with log_metric as a training loop would (0: none).")
    ] = 0.0,
    peak_mem: Annotated[
        Optional[str],
        typer.Option("--peak-mem", help="A later, larger peak (e.g. to under-run an estimate)."),
    ] = None,
    peak_at: Annotated[
        float, typer.Option("--peak-at", help="Fraction of progress at which --peak-mem is taken.")
    ] = 0.5,
    state_dir: Annotated[
        Optional[Path],
        typer.Option("--state-dir", help="Emulated GPU state (default: $COLLOCATE_EMULATED_DIR)."),
    ] = None,
) -> None:
    """Pretend to train on the emulated GPUs in CUDA_VISIBLE_DEVICES.

    Starts up (--startup), takes a CUDA context and ramps to --mem of emulated GPU memory
    (--ramp), runs first steps with no activity (--warmup), then trains at --sm/--dram; takes
    --seconds in all when alone and longer when it shares a GPU (sharing mode from
    $COLLOCATE_SHARING), prints PyTorch's out-of-memory error and exits 1 when its memory does
    not fit, and exits 143 on SIGTERM. Its memory is independent of the --mem a scheduler was
    told at submit time.
    """
    from collocate.common.units import parse_mib
    from collocate.gpus.emulated import state_dir_from_env
    from collocate.node.emulate_job import JobSpec, run_job

    spec = JobSpec(
        mem_mib=parse_mib(mem),
        seconds=seconds,
        sm=sm,
        dram=dram,
        ramp_s=ramp,
        peak_mib=None if peak_mem is None else parse_mib(peak_mem),
        peak_at=peak_at,
        startup_s=startup,
        warmup_s=warmup,
        steps_per_s=steps_per_s,
    )
    status = run_job(spec, state_dir_from_env(state_dir), os.environ)
    sys.stdout.flush()
    raise typer.Exit(status)
