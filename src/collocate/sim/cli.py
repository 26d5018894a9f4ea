"""`collocate simulate`: replay a trace under several policies and compare them."""

from __future__ import annotations

import json
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from collocate.common.cli_help import help_text
from collocate.common.errors import InputError

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID


class OutputFormat(StrEnum):
    table = "table"
    json = "json"


def register(app: typer.Typer) -> None:
    app.command("simulate", help=help_text(simulate))(simulate)


def simulate(
    trace: Annotated[Path | None, typer.Option(help="Job trace (CSV or JSONL); see docs/simulator.md.")] = None,
    workloads: Annotated[
        Path | None, typer.Option(help="Workload catalogue for traces that name workloads (carma-workloads.csv format).")
    ] = None,
    synthetic: Annotated[
        int, typer.Option(help="Instead of --trace, generate this many synthetic jobs (seeded by --seed).")
    ] = 0,
    cluster: Annotated[str, typer.Option(help="GPUs, e.g. 4xA100-40GB or 2x(8xH100-80GB) for nodes.")] = "4xA100-40GB",
    policy: Annotated[str, typer.Option(help="Comma-separated policies to compare.")] = "exclusive,carma-magm,auto",
    estimator: Annotated[
        str, typer.Option(help="Memory estimate the policies see: peak, horus, faketensor or gpumemnet.")
    ] = "peak",
    sharing: Annotated[
        str,
        typer.Option(
            help="How jobs share a device, a whole GPU or a MIG instance of --mig-layout: "
            "time-slicing or mps."
        ),
    ] = "time-slicing",
    mig_layout: Annotated[
        str | None,
        typer.Option(
            help="Split every GPU into these MIG instances, each scheduled as a GPU and shared by "
            "--sharing: MIG profile names joined by +, e.g. 3g.20gb+4g.20gb (A100-40GB) or "
            "2g.20gb+2g.20gb+3g.40gb (H100-80GB); for mixed clusters one per type, "
            "A100-40GB=...,H100-80GB=...; or default: the 3g+4g half/half split of each type, "
            "which uses the whole GPU in the fewest instances and leaves each half the memory, "
            "so larger jobs still fit. Not given: whole GPUs.",
        ),
    ] = None,
    param: Annotated[
        list[str],
        typer.Option(
            "--param",
            help="Policy parameter NAME=VALUE (repeatable), given to every compared policy that has "
            "it, as `serve --param` does.",
        ),
    ] = [],
    startup: Annotated[
        float,
        typer.Option(
            "--startup-s",
            help="Seconds from a job's start until its process shows on the GPU (import, CUDA "
            "context); the in-flight guard counts from then, as the daemon's does. 0 suits jobs of "
            "hours; about 10 for the H100 mini-trace.",
            min=0.0,
        ),
    ] = 0.0,
    profiles: Annotated[
        str,
        typer.Option(
            help="What the policies know of each job's SM/DRAM activity: 'trace' (the trace's "
            "values), 'unknown' (what a fresh daemon knows: nothing at first, then all it learns "
            "as the trace runs from what each GPU reads, alone or shared, from the job's history "
            "and its family's: a sweep's other points), 'blind' (nothing ever: 0.5/0.2 for every "
            "job) or 'learned' (as unknown, without family priors). Jobs "
            "progress by the trace's values either way.",
        ),
    ] = "trace",
    seed: Annotated[int, typer.Option(help="Seed for synthetic traces.")] = 0,
    model_error: Annotated[
        int | None,
        typer.Option(
            "--model-error",
            metavar="SEED",
            help="Run each job in a mix at the interference model's slowdown times an error drawn "
            "(seeded by SEED) from how wrong the model was on H100 mixes it had not seen, as real "
            "GPUs are; the policies still see the model. Compare policies over several seeds. Off: "
            "jobs run exactly as the model predicts. See docs/simulator.md.",
        ),
    ] = None,
    floor: Annotated[
        bool,
        typer.Option(
            "--floor",
            help="Also compute lower bounds on the makespan (arrival, SM and the model's fluid LP "
            "floor; needs scipy) and each policy's share of the exclusive-to-floor gap; see "
            "docs/simulator.md.",
        ),
    ] = False,
    no_preemption: Annotated[
        bool,
        typer.Option(
            "--no-preemption",
            help="Jobs of higher priority wait instead of freezing lower ones (as `serve "
            "--no-preemption`).",
        ),
    ] = False,
    take_back_at_once: Annotated[
        bool,
        typer.Option(
            "--freeze-at-once",
            help="Freeze as many of a GPU's jobs on trial at once as bring its slowed neighbour "
            "within the limit, instead of one per GPU every 30 s (as `serve --freeze-at-once`).",
        ),
    ] = False,
    out: Annotated[Path | None, typer.Option(help="Folder for per-job CSV and PNG plots.")] = None,
    format: Annotated[OutputFormat, typer.Option("--format", help="table or json.")] = OutputFormat.table,
) -> None:
    """Replay a job trace under one or more placement policies and compare them.

    Every policy runs through the same scheduler core as `collocate serve`; only the clock, the
    GPUs and the jobs are simulated. Estimates drive placement while out-of-memory crashes follow
    the jobs' measured peaks.
    """
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    from collocate.common.safetext import printable
    from collocate.core.gputypes import parse_cluster
    from collocate.core.model import SharingMode
    from collocate.core.policies import make_policy, parse_params, policy_parameters
    from collocate.sim.engine import PROFILE_KNOWLEDGE, SimConfig, Simulation
    from collocate.sim.metrics import completion_times, summarize, versus_exclusive
    from collocate.sim.mig import layout_text, resolve_layout
    from collocate.sim.report import legend, tables, versus_table, write_jobs_csv, write_plots, write_versus_csv
    from collocate.sim.synth import synthetic_trace
    from collocate.sim.trace import ESTIMATORS, load_catalogue, load_trace

    nodes = parse_cluster(cluster)
    if profiles not in PROFILE_KNOWLEDGE:
        raise InputError(f"unknown --profiles {profiles!r}", hint=f"valid: {', '.join(PROFILE_KNOWLEDGE)}")
    if estimator not in ESTIMATORS:
        raise InputError(f"unknown estimator {estimator!r}", hint=f"valid estimators: {', '.join(ESTIMATORS)}")
    if sharing == "mig":
        raise InputError(
            "MIG is no sharing mode: it splits GPUs into instances, which jobs share by "
            "time-slicing or mps",
            hint="use --mig-layout default (or a layout such as 3g.20gb+4g.20gb) with "
                 "--sharing time-slicing or mps",
        )
    try:
        mode = SharingMode(sharing)
    except ValueError:
        raise InputError(f"unknown sharing mode {sharing!r}", hint="valid: time-slicing, mps") from None
    layout = None if mig_layout is None else layout_text(resolve_layout(mig_layout, nodes))  # checked first
    names = [name.strip() for name in policy.split(",") if name.strip()]
    if not names:
        raise InputError("no policy given", hint="e.g. --policy exclusive,carma-magm,auto")
    params = parse_params(param)
    unused = set(params) - {p for name in names for p in policy_parameters(name)}
    if unused:
        raise InputError(
            f"no compared policy has parameter {', '.join(sorted(unused))}",
            hint="; ".join(f"{n}: {', '.join(policy_parameters(n)) or 'none'}" for n in names),
        )
    policies = [
        make_policy(name, **{k: v for k, v in params.items() if k in policy_parameters(name)})
        for name in names
    ]

    if synthetic and trace:
        raise InputError("give either --trace or --synthetic, not both")
    if synthetic:
        gpu_count = sum(n.count for n in nodes)
        jobs = synthetic_trace(
            synthetic,
            gpus=gpu_count,
            gpu_mem_mib=min(n.gpu_type.memory_mib for n in nodes),
            max_gpus_per_job=max(n.count for n in nodes),
            seed=seed,
        )
        source = f"{synthetic} synthetic jobs (seed {seed})"
    elif trace:
        catalogue = load_catalogue(workloads) if workloads else None
        jobs = load_trace(trace, catalogue)
        source = str(trace.name)
    else:
        raise InputError(
            "no trace given",
            hint="pass --trace FILE (and --workloads FILE for CARMA-style traces) or --synthetic N",
        )

    console = Console(stderr=True)
    config = SimConfig(sharing=mode, estimator=estimator, mig_layout=mig_layout, startup_s=startup,
                       profiles=profiles, model_error_seed=model_error, preemption=not no_preemption,
                       take_back_at_once=take_back_at_once)
    results = []
    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=console, transient=True, disable=format is OutputFormat.json and not console.is_terminal,
    ) as progress:
        for p in policies:
            task = progress.add_task(f"{p.name:>16}", total=len(jobs))
            sim = Simulation(nodes, jobs, p, config, progress=_advancing(progress, task))
            results.append(sim.run())
        baseline = next((r for r in results if r.policy == "exclusive"), None)
        if baseline is None:  # every policy is measured job by job against a plain queue
            task = progress.add_task(f"{'exclusive':>16}", total=len(jobs))
            baseline = Simulation(nodes, jobs, make_policy("exclusive"), config,
                                  progress=_advancing(progress, task)).run()
    summaries = [summarize(r) for r in results]
    versus = {r.policy: versus_exclusive(completion_times(r), completion_times(baseline))
              for r in results if r is not baseline}
    floor_doc = _floor_doc(jobs, nodes, mode, summaries, layout is not None) if floor else None

    written: list[Path] = []
    if out:
        out.mkdir(parents=True, exist_ok=True)
        write_jobs_csv(results, out / "jobs.csv")
        write_versus_csv(versus, out / "versus_exclusive.csv")
        written = [out / "jobs.csv", out / "versus_exclusive.csv", *write_plots(results, out)]

    if format is OutputFormat.json:
        doc = {
            "trace": source,
            "cluster": cluster,
            "estimator": estimator,
            "sharing": mode.value,
            **({"params": params} if params else {}),
            **({"startup_s": startup} if startup else {}),
            **({"profiles": profiles} if profiles != "trace" else {}),
            **({"model_error_seed": model_error} if model_error is not None else {}),
            **({"mig_layout": layout} if layout else {}),
            "policies": [s.as_dict() for s in summaries],
            **({"floor": floor_doc} if floor_doc else {}),
            "versus_exclusive": {name: v.as_dict() for name, (v, _) in versus.items()},
            "files": [str(p) for p in written],
        }
        typer.echo(json.dumps(doc, indent=2))
    else:
        sharing_text = mode.value
        if layout:
            sharing_text += " " + ", ".join(layout.values() if len(layout) == 1 else (f"{t}={v}" for t, v in layout.items()))
        error_text = "" if model_error is None else f", model error seed {model_error}"
        title = printable(f"{source} on {cluster} ({sharing_text}, estimator: {estimator}{error_text})")
        plain = Console(markup=False, emoji=False, highlight=False)  # a file name is not markup
        plain.print(title)
        for part in tables(summaries):
            plain.print()
            plain.print(part)
        versus_text = {name: v for name, (v, _) in versus.items()}
        if versus_text:
            plain.print()
            plain.print(versus_table(versus_text))
        plain.print()
        plain.print(legend(versus_text))
        if floor_doc:
            typer.echo(_floor_text(floor_doc))
        for path in written:
            typer.echo(f"wrote {path}")


def _advancing(progress: Progress, task: TaskID) -> Callable[[int, int], None]:
    """A simulation's progress callback (jobs done, jobs in all) that moves ``task`` along."""
    return lambda done, _total: progress.update(task, completed=done)


def _floor_doc(jobs, nodes, mode, summaries, mig: bool) -> dict:
    """Floors in minutes and, when `exclusive` was compared, each policy's share of the gap
    between exclusive's makespan and each floor."""
    from collocate.sim.floor import floors

    f = floors(jobs, nodes, mode, mig=mig)
    minutes = {k.replace("_s", "_min"): (None if v is None else _minutes(v))
               for k, v in f.as_dict().items() if k.endswith("_s")}
    doc: dict = {**minutes, "mixes": f.mixes, "job_types": f.job_types}
    exclusive = next((s.makespan_min for s in summaries if s.policy == "exclusive"), None)
    best = max(v for v in (minutes["sm_floor_min"], minutes["model_floor_min"], minutes["arrival_floor_min"]) if v)
    doc["floor_min"] = best
    if exclusive is not None:
        doc["gap_closed"] = {
            s.policy: {
                "model": _share(s.makespan_min, exclusive, minutes["model_floor_min"]),
                "sm": _share(s.makespan_min, exclusive, minutes["sm_floor_min"]),
            }
            for s in summaries
        }
    return doc


def _share(makespan: float, exclusive: float, floor: float | None) -> float | None:
    """A policy's share of the gap from exclusive to ``floor``; None where there is none (no
    floor, or exclusive already at it), as JSON has no NaN."""
    from collocate.sim.floor import gap_closed

    share = gap_closed(makespan, exclusive, floor) if floor else float("nan")
    return None if share != share else round(share, 3)


def _minutes(seconds: float) -> float:
    return round(seconds / 60.0, 2)


def _floor_text(doc: dict) -> str:
    """The floors, then each policy's share of the gap to them, in lines under 80 columns."""
    lines = [
        f"makespan floors (min): arrival {doc['arrival_floor_min']}, SM {doc['sm_floor_min']}, "
        f"model {doc['model_floor_min']}",
        f"  (the model floor certified; its LP {doc['model_lp_min']} over {doc['mixes']} mixes)",
    ]
    if doc.get("gap_closed"):
        lines.append("share of the gap from exclusive's makespan to each floor that a policy closes:")
    for name, gap in doc.get("gap_closed", {}).items():
        lines.append(f"  {name}: model floor {_percent(gap['model'])}, SM floor {_percent(gap['sm'])}")
    return "\n".join(lines)


def _percent(share: float | None) -> str:
    return "n/a" if share is None else f"{share + 0.0:.0%}".replace("-0%", "0%")
