"""``collocate bench``: run, report, calibrate, minitrace. Parsing and printing only."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from collocate.common.errors import CollocateError, InputError

bench_app = typer.Typer(help="Measure collocated training on a real GPU (or rehearse on CPU).",
                        no_args_is_help=True)
minitrace_app = typer.Typer(help="A real mini-trace through the daemon, compared with the "
                            "simulator.", no_args_is_help=True)
bench_app.add_typer(minitrace_app, name="minitrace")


def register(app: typer.Typer) -> None:
    app.add_typer(bench_app, name="bench")


def _csv(text: str) -> list[str]:
    return [p.strip() for p in text.split(",") if p.strip()]


def _ints(text: str, what: str) -> list[int]:
    try:
        return [int(p) for p in _csv(text)]
    except ValueError:
        raise InputError(f"cannot read {what} {text!r}", hint="write e.g. 1,2,3,7") from None


def _results_file(path: Path) -> Path:
    from collocate.bench.runner import RESULTS

    file = path / RESULTS if path.is_dir() else path
    if not file.exists():
        raise InputError(f"no results at {file}", hint="pass a folder written by "
                         "`collocate bench run` or its results.jsonl")
    return file


@bench_app.command("run")
def run(
    device: Annotated[str, typer.Option(help="cuda (a real GPU) or cpu (tiny models; not GPU "
                                        "numbers).")] = "cuda",
    workloads: Annotated[Optional[str], typer.Option(help="Comma-separated workloads "
                                                     "(default: the six of the issue).")] = None,
    copies: Annotated[str, typer.Option(help="Copy counts; 1 = alone.")] = "1,2,3,7",
    mix: Annotated[Optional[list[str]], typer.Option(help="A mix like resnet152+dlrm "
                                                     "(repeatable; replaces the default mixes).")] = None,
    no_mixes: Annotated[bool, typer.Option("--no-mixes", help="Run no mixes.")] = False,
    sharing: Annotated[str, typer.Option(help="Sharing modes for collocated scenarios.")] = "time-slicing,mps",
    seconds: Annotated[float, typer.Option(help="Measurement seconds per scenario.")] = 10.0,
    warmup: Annotated[Optional[float], typer.Option(help="Warm-up seconds (default 5 cuda, 0.5 cpu).")] = None,
    precision: Annotated[str, typer.Option(help="fp32 or bf16 (autocast).")] = "fp32",
    gpu: Annotated[int, typer.Option(help="Index of the GPU to use.")] = 0,
    gpus: Annotated[Optional[str], typer.Option(help="GPU backend for sampling (default nvml on "
                                                "cuda, emulated:1xH100-80GB on cpu).")] = None,
    period: Annotated[float, typer.Option(help="GPU sampling period, seconds.")] = 0.5,
    out: Annotated[Optional[Path], typer.Option(help="Output folder (default "
                                                "benchmarks/results/bench-<device>-<date>).")] = None,
    resume: Annotated[bool, typer.Option(help="Skip scenarios already in OUT/results.jsonl.")] = False,
    budget: Annotated[Optional[float], typer.Option(help="Stop starting scenarios after this "
                                                    "many seconds (then --resume).")] = None,
    list_: Annotated[bool, typer.Option("--list", help="Print the plan and exit.")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the plan, the environment and "
                                          "the first worker command; run nothing.")] = False,
) -> None:
    """Train built-in workloads alone, as copies and in mixes, under time-slicing and MPS."""
    from collocate.bench.plan import DEFAULT_MIXES, build_plan, format_plan, parse_mix
    from collocate.bench.workloads import DEFAULT_WORKLOADS

    if device not in ("cuda", "cpu"):
        raise InputError(f"unknown device {device!r}", hint="use cuda or cpu")
    if precision not in ("fp32", "bf16"):
        raise InputError(f"unknown precision {precision!r}", hint="use fp32 or bf16")
    warm = warmup if warmup is not None else (5.0 if device == "cuda" else 0.5)
    mixes = [] if no_mixes else ([parse_mix(m) for m in mix] if mix else list(DEFAULT_MIXES))
    plan = build_plan(_csv(workloads) if workloads else DEFAULT_WORKLOADS,
                      copies=_ints(copies, "--copies"), mixes=mixes, sharing=_csv(sharing))
    if list_ or dry_run:
        typer.echo(format_plan(plan, warmup_s=warm, seconds=seconds))
        if dry_run:
            _print_dry_run(plan, device, seconds, warm, precision, gpu)
        return
    _run(plan, device=device, seconds=seconds, warmup=warm, precision=precision, gpu=gpu,
         gpus=gpus, period=period, out=out, resume=resume, budget=budget)


def _print_dry_run(plan, device: str, seconds: float, warm: float, precision: str,
                   gpu: int) -> None:
    from collocate.bench.envinfo import environment
    from collocate.bench.runner import RunOptions, worker_argv

    opts = RunOptions(device=device, seconds=seconds, warmup=warm, precision=precision)
    files = {k: Path(f"<work>/{k}") for k in ("out", "ready", "go", "stop")}
    if plan:
        typer.echo("first worker: " + " ".join(worker_argv(opts, plan[0].jobs[0], files)))
    typer.echo("environment: " + json.dumps(environment(device, gpu_index=gpu)))


def _run(plan, *, device: str, seconds: float, warmup: float, precision: str, gpu: int,
         gpus: str | None, period: float, out: Path | None, resume: bool,
         budget: float | None) -> None:
    import socket
    import tempfile

    from collocate.bench.envinfo import device_slug, environment
    from collocate.bench.report import write_all
    from collocate.bench.runner import RunOptions, read_results, run_plan
    from collocate.gpus.registry import open_backend

    if device == "cuda":
        from collocate.gpus.nvml import nvml_available

        if not nvml_available():
            raise CollocateError("--device cuda needs an NVIDIA GPU, and NVML found none here",
                                 hint="use --device cpu to rehearse with tiny models on the CPU "
                                 "(its numbers are not GPU measurements)")
    env = environment(device, gpu_index=gpu)
    folder = out or Path("benchmarks/results") / f"bench-{device_slug(env)}-{env['date_utc']}"
    state = Path(tempfile.mkdtemp(prefix="cbench-"))
    spec = gpus or ("nvml" if device == "cuda" else "emulated:1xH100-80GB")
    backend = open_backend(spec, state_dir=state, node=socket.gethostname())
    try:
        devices = backend.devices()
        if not 0 <= gpu < len(devices):
            raise InputError(f"no GPU {gpu}: the backend has {len(devices)}",
                             hint=f"use --gpu 0..{len(devices) - 1}")
        target = devices[gpu]
        mps_factory = None
        if device == "cuda":
            from collocate.gpus.mps import MpsControl

            def mps_factory() -> MpsControl:  # a private MPS directory per scenario
                return MpsControl(Path(tempfile.mkdtemp(prefix="cbmps-")))
        opts = RunOptions(device=device, seconds=seconds, warmup=warmup, precision=precision,
                          period_s=period)
        records = run_plan(plan, backend=backend, uuid=target.uuid, total_mib=target.total_mib,
                           out_dir=folder, opts=opts, env_info=env, mps_factory=mps_factory,
                           budget_s=budget, resume=resume, log=typer.echo)
    finally:
        backend.close()
    for path in write_all(records or read_results(folder / "results.jsonl"), folder):
        typer.echo(f"wrote {path}")
    typer.echo(f"wrote {folder / 'results.jsonl'} and {folder / 'samples.jsonl'}")


@bench_app.command("report")
def report(
    results: Annotated[Path, typer.Argument(help="Folder or results.jsonl of `bench run`.")],
    out: Annotated[Optional[Path], typer.Option(help="Folder (default: the results' folder).")] = None,
) -> None:
    """Rebuild summary.csv, table.md and the plots from a results file."""
    from collocate.bench.report import write_all
    from collocate.bench.runner import read_results

    file = _results_file(results)
    folder = out or file.parent
    folder.mkdir(parents=True, exist_ok=True)
    for path in write_all(read_results(file), folder):
        typer.echo(f"wrote {path}")


@bench_app.command("calibrate")
def calibrate(
    results: Annotated[Path, typer.Argument(help="Folder or results.jsonl of `bench run`.")],
    out: Annotated[Path, typer.Option(help="Fitted model (TOML, packaged format).")] = Path("interference.toml"),
    profiles_out: Annotated[Optional[Path], typer.Option(help="Measured solo profiles (TOML).")] = None,
    report_out: Annotated[Optional[Path], typer.Option("--report", help="Markdown report.")] = None,
) -> None:
    """Fit the interference and power model to measurements; report leave-one-mix-out error."""
    from collocate.bench.calibrate import calibrate as fit
    from collocate.bench.calibrate import report_markdown, write_outputs
    from collocate.bench.runner import read_results

    file = _results_file(results)
    cal = fit(read_results(file), source=f"{file.resolve().parent.name}/{file.name}")  # names the run
    typer.echo(report_markdown(cal))
    for path in write_outputs(cal, out, profiles_out, report_out):
        typer.echo(f"wrote {path}")


@minitrace_app.command("build")
def minitrace_build(
    results: Annotated[Path, typer.Argument(help="Folder or results.jsonl with the alone runs.")],
    out: Annotated[Path, typer.Option(help="Folder for trace.csv, jobs.json, submit.sh.")] = Path("minitrace"),
    jobs: Annotated[int, typer.Option(help="Number of jobs.")] = 12,
    seed: Annotated[int, typer.Option(help="Seed for workloads, sizes and arrivals.")] = 0,
    gap: Annotated[float, typer.Option(help="Mean seconds between arrivals.")] = 8.0,
    target_scale: Annotated[float, typer.Option(help="Scale every job's training time "
                                                "(targets: small 15-35 s, medium 25-50 s, "
                                                "large 35-70 s).")] = 1.0,
) -> None:
    """Make the mini-trace from measured solo runs: simulator trace + daemon submissions."""
    from collocate.bench.minitrace import CPU_TRACE_NOTE, build_files
    from collocate.bench.report import env_of
    from collocate.bench.runner import read_results

    file = _results_file(results)
    records = read_results(file)
    for path in build_files(records, out, source=file.name, n_jobs=jobs, seed=seed,
                            mean_gap_s=gap, target_scale=target_scale):
        typer.echo(f"wrote {path}")
    from collocate.bench.minitrace import read_jobs_json

    built, _ = read_jobs_json(out / "jobs.json")
    typer.echo(f"{len(built)} jobs over {max(j.arrival_s for j in built):.0f} s of arrivals; "
               f"their solo durations add up to {sum(j.duration_s for j in built):.0f} s "
               "(about the exclusive makespan on one GPU)")
    if env_of(records).get("measured_on") != "cuda":
        typer.echo(f"note: {CPU_TRACE_NOTE}")


@minitrace_app.command("run")
def minitrace_run(
    jobs: Annotated[Path, typer.Argument(help="jobs.json from `minitrace build`.")],
    policy: Annotated[str, typer.Option(help="Daemon placement policy.")] = "auto",
    sharing: Annotated[str, typer.Option(help="time-slicing or mps.")] = "time-slicing",
    gpus: Annotated[str, typer.Option(help="Daemon GPU backend: nvml, or emulated:1xH100-80GB "
                                      "with --emulate.")] = "nvml",
    out: Annotated[Path, typer.Option(help="Folder for the run's files.")] = Path("minitrace-run"),
    emulate: Annotated[bool, typer.Option(help="Emulated jobs (CPU dry run; not GPU numbers).")] = False,
    time_scale: Annotated[float, typer.Option(help="Scale arrivals (and emulated durations).")] = 1.0,
    param: Annotated[Optional[list[str]], typer.Option(help="Policy NAME=VALUE (repeatable).")] = None,
    timeout: Annotated[Optional[float], typer.Option(help="Give up after this many seconds.")] = None,
) -> None:
    """Replay the mini-trace through `collocate serve` and summarise it like the simulator."""
    from collocate.bench.envinfo import environment
    from collocate.bench.minitrace import read_jobs_json
    from collocate.bench.minitrace_run import run_minitrace
    from collocate.core.model import SharingMode

    if sharing not in set(SharingMode):
        raise InputError(f"unknown sharing mode {sharing!r}", hint=f"use {' or '.join(SharingMode)}")
    if emulate != gpus.startswith("emulated"):
        raise InputError("--emulate goes with --gpus emulated:<spec>, real jobs with --gpus nvml",
                         hint="e.g. --emulate --gpus emulated:1xH100-80GB for a CPU dry run")
    trace_jobs, _ = read_jobs_json(jobs)
    summary = run_minitrace(trace_jobs, policy=policy, sharing=sharing, gpus=gpus, out_dir=out,
                            emulate=emulate, time_scale=time_scale, timeout_s=timeout,
                            params=param or [], log=typer.echo)
    summary["env"] = environment("cpu" if emulate else "cuda")
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    typer.echo(json.dumps({k: v for k, v in summary.items() if k not in ("job_ids", "env")}))


@minitrace_app.command("compare")
def minitrace_compare(
    real: Annotated[list[Path], typer.Option(help="Folders of `minitrace run` (repeatable).")],
    sim: Annotated[list[Path], typer.Option(help="`collocate simulate --format json` outputs.")],
    out: Annotated[Path, typer.Option(help="Markdown table.")] = Path("minitrace-compare.md"),
) -> None:
    """Table of real runs beside the simulator's predictions for the same trace."""
    from collocate.bench.minitrace_run import compare

    def load(path: Path) -> dict:
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise InputError(f"cannot read {path}: {exc}") from None

    runs = [load(p / "summary.json" if p.is_dir() else p) for p in real]
    sims = [load(p) for p in sim]
    env = next((r.get("env") for r in runs if r.get("env")), None)
    out.write_text(compare(runs, sims, env))
    typer.echo(out.read_text())
    typer.echo(f"wrote {out}")
