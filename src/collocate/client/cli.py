"""The client commands: submit, ls, show, logs, cancel, wait, gpus, drain, resume,
dashboard-url (and ``control``'s hold, release, priority, limits). Parsing and rendering only;
the work happens in the daemon, reached through ``connect.Client`` over its Unix socket or TCP.
``logs`` polls it from ``follow``."""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from collocate.common.cli_options import ErrorOpt, FingerprintOpt, HostOpt, OutputOpt, StateDirOpt, TokenFileOpt
from collocate.common.cli_params import Argument, Option, echo
from collocate.common.errors import CollocateError, InputError

if TYPE_CHECKING:
    import typer

    from collocate.estimate.base import Estimate
    from collocate.estimate.providers import EstimateRequest

FORMATS = ("table", "json")
FormatOpt = Annotated[str, Option("--format", help="table (for people) or json (for tools).")]


def _format(fmt: str) -> str:
    """One --format vocabulary for every command; anything else is refused with the list."""
    if fmt not in FORMATS:
        raise InputError(f"unknown --format {fmt!r}", hint="use " + " or ".join(FORMATS))
    return fmt


def register(app: typer.Typer) -> None:
    from collocate.common.cli_help import help_text  # only where the Typer app is built

    app.command("submit", help=help_text(submit), context_settings={"allow_interspersed_args": False})(submit)
    app.command("ls")(ls)
    app.command("show")(show)
    app.command("logs", help=help_text(logs))(logs)
    app.command("cancel")(cancel)
    app.command("wait")(wait)
    app.command("gpus")(gpus)
    from collocate.client.control import hold, limits, priority_, release, suspend

    app.command("hold")(hold)
    app.command("suspend")(suspend)
    app.command("release")(release)
    app.command("priority")(priority_)
    app.command("limits", help=help_text(limits))(limits)
    from collocate.client.update import update

    app.command("update")(update)
    app.command("drain")(drain)
    app.command("resume")(resume)
    app.command("dashboard-url")(dashboard_url)
    from collocate.client.interactive import run

    app.command("run", help=help_text(run), context_settings={"allow_interspersed_args": False})(run)


def _client(state_dir: Path | None, host: str | None = None, token_file: Path | None = None,
            fingerprint: str | None = None):
    """The daemon's client: over its Unix socket, or with ``host`` over TCP (TLS, token)."""
    from collocate.client.connect import client_for

    return client_for(state_dir, host=host, token_file=token_file, fingerprint=fingerprint)


def submit(
    ctx: typer.Context,
    command: Annotated[list[str] | None, Argument(help="The command, after --.")] = None,
    gpus: Annotated[int, Option("--gpus", help="GPUs the job needs (on each node, with --nodes). 0: a CPU job (a pipeline's "
                  "prepare or evaluate step), started at once with CUDA_VISIBLE_DEVICES empty, within "
                  "the per-user cap on CPU jobs (collocate limits --max-cpu-jobs).")] = 1,
    nodes: Annotated[int, Option("--nodes", help="Run on this many different nodes, --gpus "
                     "on each, all at once: the command starts once per node with NNODES, "
                     "NODE_RANK, MASTER_ADDR, MASTER_PORT and torchrun's PET_* set "
                     "(docs/multi-node.md).")] = 1,
    mem: Annotated[str | None, Option("--mem", help="GPU memory per GPU, with a unit: "
                   "6GiB, 6144MiB, 1.5G. K, M, G and T are powers of 1024 with or without i or B "
                   "(6GB = 6G = 6GiB, as nvidia-smi and PyTorch count); a number without a unit "
                   "is refused.")] = None,
    name: Annotated[str | None, Option("--name", "-J", help="The job's name in `ls` (as sbatch -J; "
                    "default: from the command); a --sweep's {placeholders} are filled in.")] = None,
    priority: Annotated[int, Option("--priority", help="Higher runs first (within "
                        "+/-1,000,000). Above 0 only the daemon's owner may set; others use --nice.")] = 0,
    nice: Annotated[int | None, Option("--nice", help="Lower this job's priority by N "
                    "(0 to 1,000,000), to let your other jobs or other people's go first.")] = None,
    time_limit: Annotated[str | None, Option("--time", "-t", help="Time limit, as Slurm reads "
                          "it: minutes (30), MM:SS, HH:MM:SS, D-HH:MM:SS, or 90s, 30m, 2h, 1d. "
                          "The job is stopped then (SIGTERM, SIGKILL 10 s later), state timeout.")] = None,
    retries: Annotated[int | None, Option("--retries", help="Retries (OOM: default 3; "
                        "giving it also retries other failures).")] = None,
    cwd: Annotated[Path | None, Option("--cwd", help="Working directory (default: here).")] = None,
    env: Annotated[list[str], Option("--env", help="NAME=VALUE for the job (repeatable).")] = [],
    estimate: Annotated[str | None, Option("--estimate", help="Estimate memory statically from "
                        "this entry point (package.module:function), instead of --mem.")] = None,
    batch_size: Annotated[int | None, Option("--batch-size", help="Batch size for --estimate.")] = None,
    precision: Annotated[str, Option("--precision", help="For --estimate: fp32, fp16 (AMP) or bf16 "
                         "(AMP), as the job trains.")] = "fp32",
    optimizer: Annotated[str | None, Option("--optimizer", help="For --estimate: sgd, adam or adamw "
                         "(default: the entry point's).")] = None,
    gpu_type: Annotated[str | None, Option("--gpu-type", help="For --estimate: the GPU type to "
                        "estimate for, e.g. H100-80GB (collocate estimate --gpu). Default: the "
                        "daemon's, when all its GPUs are of one type.")] = None,
    dataset: Annotated[str | None, Option("--dataset", help="Shared dataset name: the daemon "
                       "runs one producer for all jobs naming it (see docs/daemon.md).")] = None,
    dataset_factory: Annotated[str | None, Option("--dataset-factory", help="module:factory "
                               "returning the DataLoader to share (needed by the first job of a "
                               "--dataset; later ones may omit it).")] = None,
    after: Annotated[list[str], Option("--after", help="Start only once this job has ended "
                     "done (repeatable); if it fails or is cancelled, this one is cancelled.")] = [],
    after_any: Annotated[list[str], Option("--after-any", help="Start once this job has "
                         "ended, however it ended (Slurm's afterany; repeatable).")] = [],
    after_notok: Annotated[list[str], Option("--after-notok", help="Start only if this job "
                           "ends other than done: failed, timeout, cancelled (Slurm's afternotok; "
                           "repeatable); if it ends done, this one is cancelled.")] = [],
    hold: Annotated[bool, Option("--hold", help="Queue it held: it starts only after "
                    "`collocate release ID`.")] = False,
    notify: Annotated[str | None, Option("--notify", help="A command to run, as you, when "
                      "the job ends: e.g. 'mail -s collocate you@lab'. Its stdin is a one-line "
                      "summary; COLLOCATE_JOB_ID, _NAME, _STATE, _REASON and _EXIT_CODE are set. "
                      "Split like a shell would, but not run through one.")] = None,
    public: Annotated[bool, Option("--public", help="Let the daemon's other users see this "
                      "job's command, working directory and logs (they see its name, state and "
                      "times anyway).")] = False,
    no_mem_fence: Annotated[bool, Option("--no-mem-fence", help="Do not cap this job's GPU "
                            "memory at what it committed (by default a PyTorch job's caching "
                            "allocator is capped there). The cost: if it outgrows that, it may "
                            "crash its neighbours instead of itself; it is still charged for the "
                            "overrun, its requirement raised from what it held.")] = False,
    sweep: Annotated[list[str], Option("--sweep", help="NAME=V1,V2,... or NAME=FIRST..LAST: "
                     "one job per combination, {NAME} in the command, --name, --output, "
                     "--error and --env values replaced (repeatable).")] = [],
    sweep_max: Annotated[int | None, Option("--sweep-max", help="Run at most N of the "
                         "sweep's jobs at once (Slurm's --array=0-9%N); the others wait.")] = None,
    output: OutputOpt = None, error: ErrorOpt = None,
    fmt: Annotated[str, Option("--format", help="table: the id (a sweep: one per line); json: "
                   "an object with id, name, state and memory (a sweep: a list of them).")] = "table",
    state_dir: StateDirOpt = None, host: HostOpt = None,
    token_file: TokenFileOpt = None, fingerprint: FingerprintOpt = None,
) -> None:
    """Queue a job and print its id: collocate submit --mem 6GiB -- python train.py --lr 3e-4

    A job script runs as a job, its options read from its #COLLOCATE lines (as sbatch reads
    #SBATCH; an option given here wins): collocate submit train.sh

    A sweep queues one job per combination and prints their ids, one per line (--sweep-max 2:
    at most two of them run at once; {lr} is filled in --name and --output too):
    collocate submit --mem 6GiB --sweep lr=1e-3,3e-4 --sweep seed=0..2 -- python train.py --lr {lr} --seed {seed}

    Its output in a file of yours too, as sbatch -o (%j: the job id, %x: its name):
    collocate submit --mem 6GiB -o 'runs/%x-%j.out' -- python train.py
    """
    if (script := _script_params(ctx, command)) is not None:  # `submit train.sh`: its #COLLOCATE lines
        return script()
    from collocate.client.sweep import expand, parse_axis
    from collocate.common.units import parse_mib, require_unit
    from collocate.wire.spec import default_name, parse_env

    _format(fmt)
    if not command:
        raise InputError("empty command", hint="put the command after --, e.g. "
                         "collocate submit --mem 6GiB -- python train.py")
    parse_env(env)  # a clear error before contacting the daemon
    if nice is not None:
        if priority:
            raise InputError("give --priority or --nice, not both", hint="--nice N is --priority -N")
        if not 0 <= nice <= 1_000_000:
            raise InputError(f"--nice takes 0 to 1,000,000, got {nice}")
        priority = -nice
    if time_limit is not None:
        from collocate.common.units import parse_duration

        parse_duration(time_limit)
    if mem is not None:
        require_unit(mem, "--mem")
        parse_mib(mem)  # a clear error before contacting the daemon
    if sweep_max is not None and not sweep:
        raise InputError("--sweep-max bounds a sweep", hint="give --sweep NAME=VALUES too, or drop --sweep-max")
    if sweep_max is not None and not 1 <= sweep_max <= 10_000:
        raise InputError(f"--sweep-max takes 1 to 10,000, got {sweep_max}")
    points = expand(command, [parse_axis(a) for a in sweep], (name, output, error, *env)) if sweep else None
    directory = (cwd or Path.cwd()).expanduser().absolute()
    if not directory.is_dir():
        raise InputError(f"working directory {directory} does not exist", hint="pass an existing --cwd")
    from collocate.wire.outputs import check_directory

    paths = [(output, error)] if points is None else [(p.path(output), p.path(error)) for p in points]
    for out_path, err_path in paths:
        check_directory(out_path, "--output", str(directory))
        check_directory(err_path, "--error", str(directory))
    extra: dict[str, Any] = {"mem": mem}
    client = _client(state_dir, host, token_file, fingerprint)
    if estimate is not None:  # once for a whole sweep: its jobs share the entry point
        from collocate.estimate.entrypoint import OPTIMIZERS, PRECISIONS, check_choice
        from collocate.estimate.providers import EstimateRequest

        request = EstimateRequest(entry_point=estimate, batch_size=batch_size,
                                  optimizer=check_choice("optimizer", optimizer, OPTIMIZERS),
                                  precision=check_choice("precision", precision, PRECISIONS) or "fp32",
                                  gpu=gpu_type or _daemon_gpu_type(client))
        extra = _static_estimate(request, mem, directory, {**os.environ, **parse_env(env)})
    elif (precision, optimizer, gpu_type) != ("fp32", None, None):
        raise InputError("--precision, --optimizer and --gpu-type describe --estimate",
                         hint="add --estimate ENTRY --batch-size N, or drop them")
    fields = dict(gpus=gpus, nodes=nodes, priority=priority, retries=retries, cwd=str(directory), env=list(env),
                  base_env=dict(os.environ), dataset=dataset, dataset_factory=dataset_factory,
                  after=list(after), after_any=list(after_any), after_notok=list(after_notok),
                  time=time_limit, hold=hold, public=public, notify=_notify_argv(notify), **extra)
    if no_mem_fence:
        fields["no_mem_fence"] = True
    if points is None:
        queued = client.request("submit", argv=list(command), name=name, output=output, error=error, **fields)
        echo(json.dumps(_queued(queued, name or default_name(command)), indent=1) if fmt == "json"
                   else queued["id"])
        return
    base = name or default_name(command)
    listed: list[dict[str, Any]] = []
    sweep_of: dict[str, Any] = {"sweep": "new", "sweep_max": sweep_max}  # then the first job's id
    for done, point in enumerate(points):
        try:
            result = client.request("submit", argv=list(point.command), name=point.name(base),
                                    output=point.path(output), error=point.path(error), **sweep_of,
                                    **{**fields, "env": [point.fill(e) for e in env]})
            sweep_of = {"sweep": sweep_of["sweep"] if done else result["id"]}
        except CollocateError as exc:
            if not done:
                raise
            if fmt == "json":
                echo(json.dumps(listed, indent=1))
            raise CollocateError(f"{exc.args[0]} ({done} of {len(points)} sweep jobs were queued "
                                 "before it; their ids are printed above)", hint=exc.hint) from exc
        if fmt == "json":
            listed.append(_queued(result, point.name(base)))
        else:
            echo(result["id"])
    if fmt == "json":
        echo(json.dumps(listed, indent=1))


def _queued(answer: dict[str, Any], name: str) -> dict[str, Any]:
    """``submit --format json``'s object for one queued job: the daemon's answer (id, name,
    state, memory and where that figure comes from); ``name`` for a daemon that gave none."""
    return {"name": name, **answer}


def _script_params(ctx: typer.Context | None, command: list[str] | None) -> Any:
    """When ``command`` runs a job script: submit again with the script's ``#COLLOCATE``
    options merged in (``client/script.py``), as a thunk; else None. No ``ctx``: the fast path
    (``cli_fast``), which leaves every command naming a file to Typer."""
    from collocate.client.script import merged_params, script_of

    if ctx is None or ctx.meta.get("collocate.script") or (script := script_of(command)) is None:
        return None
    ctx.meta["collocate.script"] = True
    params = merged_params(ctx, script)
    note = script.sbatch_note()
    if note:
        echo(note, err=True)

    def again() -> None:
        try:
            ctx.invoke(ctx.command.callback, **params)  # type: ignore[arg-type]
        except InputError as exc:
            raise script.blame(exc) from None
    return again


def _notify_argv(notify: str | None) -> list[str] | None:
    """``--notify 'mail -s "job done" me'`` as argv, split as a POSIX shell would."""
    import shlex

    if notify is None:
        return None
    try:
        argv = shlex.split(notify)
    except ValueError as exc:
        raise InputError(f"cannot read --notify {notify!r}: {str(exc).lower()}",
                         hint="close every quote, e.g. --notify 'mail -s \"job done\" you@lab'") from None
    if not argv:
        raise InputError("--notify is empty", hint="e.g. --notify 'mail -s collocate you@lab'")
    return argv


def _daemon_gpu_type(client: Any) -> str | None:
    """The GPU type to estimate for when the user names none: the daemon's, if all its GPUs
    are of one known type (a CUDA context's size differs by GPU). Asking first also fails fast,
    before estimating, when no daemon is running."""
    from collocate.core.gputypes import GPU_TYPES

    types = {row["type"] for row in client.request("gpus")}
    if len(types) == 1 and (only := types.pop()) in GPU_TYPES:
        return str(only)
    return None


def _static_estimate(request: EstimateRequest, mem: str | None, cwd: Path,
                     job_env: dict[str, str]) -> dict[str, Any]:
    """Run the static estimator here, in the user's environment and cwd (where the entry point
    imports), in a child process; the daemon still prefers measured history when it has one.
    The job's own ``PYTORCH_CUDA_ALLOC_CONF`` picks the allocator mode estimated."""
    from collocate.estimate.gpu_overheads import DEFAULT_GPU, allocator_from_conf
    from collocate.estimate.providers import StaticProvider

    if mem is not None:
        raise InputError("give either --mem or --estimate, not both")
    if request.batch_size is None:
        raise InputError("--estimate needs --batch-size", hint="e.g. --estimate mypkg.train:build --batch-size 32")
    request = replace(request, allocator=allocator_from_conf(job_env.get("PYTORCH_CUDA_ALLOC_CONF")))
    here = Path.cwd()
    os.chdir(cwd)
    try:
        est = StaticProvider(isolated=True).estimate(request)
    finally:
        os.chdir(here)
    if est is None or not est.available:
        raise InputError(f"no static estimate for {request.entry_point}", hint="pass --mem instead")
    echo(f"estimated {est.mib:.0f} MiB ({est.method}, +/-{est.uncertainty:.0%}, {request.precision}, "
               f"{request.allocator} allocator, {request.gpu or DEFAULT_GPU + ' by default: pass --gpu-type'})",
               err=True)
    from collocate.estimate.cli import expandable_tip_mib

    expandable = expandable_tip_mib(est)
    if expandable is not None:
        echo(f"tip: with --env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True it would need "
                   f"about {expandable:.0f} MiB", err=True)
    return estimate_fields(est)


def estimate_fields(est: Estimate) -> dict[str, Any]:
    """The memory fields of a submit request for a static estimate: an estimate, not a
    declaration, so the daemon commits it only until the job's own peak holds still."""
    return {"mem": f"{est.mib:.1f}", "mem_source": f"static-{est.method}", "mem_uncertainty": est.uncertainty}


def ls(
    all_: Annotated[bool, Option("--all", "-a", help="Include ended jobs.")] = False,
    state: Annotated[list[str], Option("--state", "-s", "-t", help="Only jobs in these states: "
                     "pending, running, suspended, done, failed, timeout, cancelled, rejected, or Slurm's "
                     "PD, R, S, CD, ... (repeatable or a comma list; an ended state implies --all).")] = [],
    user: Annotated[list[str], Option("--user", "-u", help="Only jobs of this user "
                    "(repeatable or a comma list).")] = [],
    mine: Annotated[bool, Option("--me", help="Only your own jobs (squeue --me).")] = False,
    name: Annotated[str | None, Option("--name", "-n", help="Only jobs whose name matches "
                    "this shell glob, e.g. 'train.py*' (quote it).")] = None,
    since: Annotated[str | None, Option("--since", "-S", help="Only jobs in the queue or running "
                     "at or after this time: 2026-11-28, 2026-11-28T14:00, 14:00 (today), 2h or 1d ago, "
                     "or sacct's today, now-3hours, 11/28 (its --starttime; implies --all; adds START and "
                     "END columns where the terminal has room).")] = None,
    until: Annotated[str | None, Option("--until", "-E", help="Only jobs submitted at or before "
                     "this time (sacct's --endtime; same forms; implies --all).")] = None,
    jobs: Annotated[list[str], Option("--jobs", "-j", help="Only these jobs: 7, 3-7, 3,5,9 "
                    "(squeue -j, sacct -j; ended ones too).")] = [],
    fmt: FormatOpt = "table",
    state_dir: StateDirOpt = None, host: HostOpt = None,
    token_file: TokenFileOpt = None, fingerprint: FingerprintOpt = None,
) -> None:
    """List jobs (pending and running; --all for every job), with why each pending one waits."""
    from collocate.client import render
    from collocate.client.connect import list_jobs
    from collocate.client.select import filter_rows, me, needs_ended, parse_ids, parse_states

    _format(fmt)
    states = parse_states(state)
    users = {u.strip() for value in user for u in value.split(",") if u.strip()} | ({me()} if mine else set())
    from collocate.client.select import in_window, parse_when

    now = time.time()
    start = None if since is None else parse_when(since, "--since", now)
    end = None if until is None else parse_when(until, "--until", now)
    dated = start is not None or end is not None
    ids = parse_ids(jobs) if jobs else None
    rows = list_jobs(_client(state_dir, host, token_file, fingerprint).request, ids=ids,
                     all=all_ or dated or needs_ended(states) or ids is not None)
    rows = [r for r in filter_rows(rows, states=states, users=users, name=name) if in_window(r, start, end, now)]
    if fmt == "json":
        echo(json.dumps(rows, indent=1))
    else:
        render.print_jobs(rows, dated=dated)


def show(job_id: Annotated[str, Argument()], state_dir: StateDirOpt = None, host: HostOpt = None,
    token_file: TokenFileOpt = None, fingerprint: FingerprintOpt = None,
         fmt: FormatOpt = "table") -> None:
    """Show one job: its command, memory requirement, why it waits, and every attempt."""
    from collocate.client import render

    _format(fmt)
    detail = _client(state_dir, host, token_file, fingerprint).request("show", id=job_id)
    if fmt == "json":
        echo(json.dumps(detail, indent=1))
    else:
        render.print_detail(detail)


def logs(
    job_id: Annotated[str, Argument()],
    follow: Annotated[bool, Option("--follow", "-f", help="Keep printing, through every later "
                      "attempt (OOM requeues, retries), until the job ends.")] = False,
    stderr: Annotated[bool, Option("--stderr", help="Show stderr instead of stdout.")] = False,
    attempt: Annotated[int | None, Option("--attempt", help="Attempt number (default: the "
                       "latest); with -f, follow only that attempt.")] = None,
    node: Annotated[str | None, Option("--node", help="A job on several nodes: the part on "
                    "this node (default: rank 0's; `collocate show` lists the nodes).")] = None,
    notify: Annotated[bool, Option("--notify", help="The output of the job's --notify "
                      "command instead (with --stderr, its stderr).")] = False,
    fmt: Annotated[str, Option("--format", help="table: the output as written; json: one "
                   "object, the attempt's whole output so far in \"text\" (not with -f).")] = "table",
    state_dir: StateDirOpt = None, host: HostOpt = None,
    token_file: TokenFileOpt = None, fingerprint: FingerprintOpt = None,
) -> None:
    """Print a job's output (its latest attempt unless --attempt; -f follows it to the end).

    A job that has not started says so on stderr, with why it waits. Another user's output (as
    the daemon's owner may read it) has its control characters escaped; your own is as written.
    """
    from collocate.client.follow import print_logs
    from collocate.client.select import me

    _format(fmt)
    if fmt == "json" and follow:
        raise InputError("--format json prints one object, so not with -f",
                         hint=f"wait for the end, then read it: collocate wait {job_id}; "
                         f"collocate logs {job_id} --format json")
    client = _client(state_dir, host, token_file, fingerprint)
    if fmt == "json":
        echo(json.dumps(_logs_object(client, job_id, "stderr" if stderr else "stdout",
                                           attempt, node, notify), indent=1))
        return
    if notify:
        _print_notify_logs(client, job_id, "stderr" if stderr else "stdout")
        return
    owner = client.request("show", id=job_id)["user"]
    try:
        print_logs(client.request, job_id, stream="stderr" if stderr else "stdout",
                   attempt=attempt, follow=follow, out=sys.stdout, err=sys.stderr,
                   escape_output=owner != me(), node=node)
    except KeyboardInterrupt:  # Ctrl-C is how a follow ends: no traceback, no "Aborted!"
        raise SystemExit(130) from None
    except BrokenPipeError:  # `collocate logs 3 | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise SystemExit(0) from None


def _logs_object(client: Any, job_id: str, stream: str, attempt: int | None, node: str | None,
                 notify: bool) -> dict[str, Any]:
    """``logs --format json``: one attempt's whole output so far (the latest unless ``attempt``),
    as the job wrote it (JSON escapes its control characters), with the job's state and why.
    ``attempt`` is null for a job that has not started (``reason`` says why it waits) and for
    the output of its ``--notify`` command (``notify`` true)."""
    args: dict[str, Any] = {"stream": stream, **({"notify": True} if notify else {}),
                            **({"node": node} if node is not None else {})}
    text, offset, n = [], 0, attempt
    while True:
        chunk = client.request("logs", id=job_id, offset=offset, **args, **({} if notify else {"attempt": n}))
        n = None if notify else chunk.get("attempt")  # pinned: a new attempt does not mix in
        text.append(chunk.get("text", ""))
        offset = chunk.get("offset", offset)
        if not chunk.get("text"):
            break
    job = client.request("show", id=job_id)
    return {"id": job_id, "state": job["state"], "reason": job["reason"], "attempt": n, "stream": stream,
            "node": node, "notify": notify, "text": "".join(text), "purged": bool(chunk.get("purged"))}


def _print_notify_logs(client: Any, job_id: str, stream: str) -> None:
    """``logs --notify``: what the job's --notify command wrote (it runs once the job ends)."""
    offset = 0
    while True:
        chunk = client.request("logs", id=job_id, notify=True, stream=stream, offset=offset)
        if not chunk["started"]:
            echo(f"job {job_id}'s --notify command has not run (it runs once the job ends; "
                       "a job submitted without --notify has none)", err=True)
            return
        sys.stdout.write(chunk["text"])
        if not chunk["text"]:
            return
        offset = chunk["offset"]


def cancel(
    job_ids: Annotated[list[str] | None, Argument(metavar="IDS", help="Job ids, ranges "
                       "and lists: 7, 3-7, 3,5,9.", show_default=False)] = None,
    all_: Annotated[bool, Option("--all", help="Cancel all your own pending and running "
                    "jobs.")] = False,
    name: Annotated[str | None, Option("--name", "-n", help="Cancel your own pending and "
                    "running jobs whose name matches this shell glob, e.g. 'sweep*' (quote it).")] = None,
    state: Annotated[list[str], Option("--state", "-s", "-t", help="Only jobs in these states: "
                     "pending, running or suspended, or PD, R, S (as scancel -t; repeatable or a comma list).")] = [],
    user: Annotated[list[str], Option("--user", "-u", help="Only jobs of this user (default: "
                    "yours; another's only as the daemon's owner, who may cancel them).")] = [],
    fmt: FormatOpt = "table",
    state_dir: StateDirOpt = None, host: HostOpt = None,
    token_file: TokenFileOpt = None, fingerprint: FingerprintOpt = None,
) -> None:
    """Cancel jobs: pending ones leave the queue, running ones get SIGTERM (SIGKILL after 10 s).

    Prints what happened to each job; exits 1 if any could not be cancelled.
    """
    from collocate.client.connect import list_jobs
    from collocate.client.select import ACTIVE, filter_rows, me, parse_ids, parse_states
    from collocate.common.safetext import printable

    _format(fmt)
    ids = parse_ids(job_ids or [])
    states = parse_states(state)
    if states - set(ACTIVE):
        raise InputError(f"--state {', '.join(sorted(states - set(ACTIVE)))}: an ended job has nothing to cancel",
                         hint="use --state pending or --state running")
    users = {u.strip() for value in user for u in value.split(",") if u.strip()}
    filters = all_ or name is not None or bool(states) or bool(users)
    if ids and filters:
        raise InputError("give job ids or --all/--name/--state/--user, not both",
                         hint="the filters choose among pending and running jobs")
    if not ids and not filters:
        raise InputError("which jobs?", hint="give ids (7, 3-7, 3,5,9), --name GLOB, --state, --user or --all")
    client = _client(state_dir, host, token_file, fingerprint)
    if not ids:  # only active jobs can be chosen: the history is not fetched
        chosen = filter_rows(list_jobs(client.request), states=states or set(ACTIVE),
                             users=users or {me()}, name=name)
        ids = [r["id"] for r in chosen]
        if not ids:
            echo("no pending or running job " + ("of yours " if not users else "")
                       + "matches" + (f" the name {printable(name)}" if name is not None else ""), err=True)
            if fmt == "json":
                echo("[]")
            return
    failed = 0
    results: list[dict[str, Any]] = []
    for job_id in ids:
        try:
            result = client.request("cancel", id=job_id)
        except CollocateError as exc:
            failed += 1
            results.append({"id": job_id, "error": str(exc.args[0]), "hint": exc.hint})
            echo(f"{job_id}: not cancelled: {printable(exc, multiline=True)}", err=True)
            continue
        results.append(result)
        if fmt == "json":
            continue
        if result.get("ended"):
            echo(f"{printable(job_id)}: already {printable(result['state'])}, nothing to cancel")
            continue
        echo(f"{printable(result['id'])}: {printable(result['state'])}")
    if fmt == "json":
        echo(json.dumps(results, indent=1))
    if failed:
        raise SystemExit(1)


def wait(
    job_ids: Annotated[list[str], Argument(metavar="IDS", help="Job ids, ranges and lists: "
                       "7, 3-7, 3,5,9.", show_default=False)],
    timeout: Annotated[float | None, Option("--timeout", help="Give up after this many "
                       "seconds (exit status 124).")] = None,
    fmt: FormatOpt = "table",
    state_dir: StateDirOpt = None, host: HostOpt = None,
    token_file: TokenFileOpt = None, fingerprint: FingerprintOpt = None,
) -> None:
    """Wait until jobs end, printing each as it does; exit 0 if all ended done, else 1.

    For scripts: collocate wait $(collocate submit -- python train.py) && python evaluate.py
    """
    from collocate.client.connect import list_jobs
    from collocate.client.select import ACTIVE, parse_ids
    from collocate.common.safetext import printable

    _format(fmt)
    client = _client(state_dir, host, token_file, fingerprint)
    left = parse_ids(job_ids)
    ended_rows: list[dict[str, Any]] = []  # --format json: printed at the end
    for job_id in left:  # an unknown id fails here, before any waiting
        client.request("show", id=job_id)
    deadline = None if timeout is None else time.monotonic() + timeout
    all_done = True
    try:
        while left:
            rows = list_jobs(client.request, all=True, ids=left)  # only these, in pages
            ended = {row["id"] for row in rows if row["state"] not in ACTIVE}
            for job_id in [j for j in left if j in ended]:
                job = client.request("show", id=job_id)  # once per job, when it has ended
                left.remove(job_id)
                all_done &= job["state"] == "done"
                why = f": {printable(job['reason'])}" if job["reason"] and job["state"] != "done" else ""
                if fmt == "json":
                    ended_rows.append({"id": job_id, "state": job["state"], "reason": job["reason"]})
                else:
                    echo(f"{job_id} {job['state']}{why}")
            if left and deadline is not None and time.monotonic() >= deadline:
                if fmt == "json":
                    echo(json.dumps(ended_rows + [{"id": j, "state": None} for j in left], indent=1))
                echo(f"still not ended after {timeout:g} s: {', '.join(left)}", err=True)
                raise SystemExit(124)
            if left:
                time.sleep(0.5)
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    if fmt == "json":
        echo(json.dumps(ended_rows, indent=1))
    if not all_done:
        raise SystemExit(1)


def gpus(
    watch: Annotated[bool, Option("--watch", "-w", help="Refresh every second until Ctrl-C "
                       "(into a file or pipe: a dated table appended every second).")] = False,
    fmt: FormatOpt = "table",
    state_dir: StateDirOpt = None, host: HostOpt = None,
    token_file: TokenFileOpt = None, fingerprint: FingerprintOpt = None,
) -> None:
    """GPUs as the daemon sees them: memory used, committed to jobs and left (ROOM), SM
    activity, jobs on each; tracking if degraded."""
    from collocate.client import render

    _format(fmt)
    client = _client(state_dir, host, token_file, fingerprint)
    if fmt == "json":
        ping = client.request("ping")
        echo(json.dumps({"gpus": client.request("gpus"),
                               "tracking_degraded": ping.get("tracking_degraded", False),
                               "tracking": ping.get("tracking", [])}, indent=1))
        return
    if not watch:
        render.console().print(render.gpu_table(client.request("gpus")))
        degraded = render.tracking_line(client.request("ping"))
        if degraded is not None:
            render.console().print(degraded, style="red")
        return
    if not sys.stdout.isatty():  # `gpus --watch > file`: a table per second, appended
        try:
            while True:
                render.console().print(render.when(time.time()))
                render.console().print(render.gpu_table(client.request("gpus")))
                sys.stdout.flush()
                time.sleep(1.0)
        except KeyboardInterrupt:
            return
    from rich.live import Live

    with Live(render.gpu_table(client.request("gpus")).__rich__(), console=render.console().rich(),
              refresh_per_second=2) as live:
        try:
            while True:
                time.sleep(1.0)
                live.update(render.gpu_table(client.request("gpus")).__rich__())
        except KeyboardInterrupt:
            pass


def drain(fmt: FormatOpt = "table", state_dir: StateDirOpt = None, host: HostOpt = None,
    token_file: TokenFileOpt = None, fingerprint: FingerprintOpt = None) -> None:
    """Stop placing jobs; running ones finish. `collocate resume` undoes it."""
    _format(fmt)
    r = _client(state_dir, host, token_file, fingerprint).request("drain")
    if fmt == "json":
        echo(json.dumps(r, indent=1))
        return
    echo(f"draining: {r['running']} running job(s) will finish, {r['pending']} stay queued")


def resume(job_ids: Annotated[list[str] | None, Argument(
        metavar="[IDS]", help="Suspended jobs to thaw (ids, ranges, lists); none: undo `collocate drain`.",
        show_default=False)] = None,
    fmt: FormatOpt = "table",
    state_dir: StateDirOpt = None, host: HostOpt = None,
    token_file: TokenFileOpt = None, fingerprint: FingerprintOpt = None) -> None:
    """Place jobs again after `collocate drain`; with job ids, thaw jobs `collocate suspend`
    froze (your own; a job the scheduler froze thaws by itself when room returns)."""
    _format(fmt)
    if job_ids:
        from collocate.client.control import resume_jobs

        resume_jobs(job_ids, (state_dir, host, token_file, fingerprint), fmt)
        return
    r = _client(state_dir, host, token_file, fingerprint).request("resume")
    echo(json.dumps(r, indent=1) if fmt == "json" else "placing jobs again")


def dashboard_url(fmt: FormatOpt = "table", state_dir: StateDirOpt = None, host: HostOpt = None,
    token_file: TokenFileOpt = None, fingerprint: FingerprintOpt = None) -> None:
    """Print the daemon's dashboard URL with its token (readable by the daemon's owner only)."""
    from collocate.wire.paths import StateLayout

    _format(fmt)
    client = _client(state_dir, host, token_file, fingerprint)
    url = client.request("ping").get("dashboard")
    if url is None:
        raise InputError("this daemon serves no dashboard",
                         hint="start it with `collocate serve --dashboard 8765`")
    path = StateLayout(client.state_dir).dashboard_token
    try:
        token = path.read_text().strip()
    except FileNotFoundError:
        token = ""  # started with --no-dashboard-token
    except OSError as exc:
        raise CollocateError(f"the dashboard at {url} is the daemon owner's (its token in {path} "
                             f"is theirs: {exc.strerror})",
                             hint="open your own, with your rights: `collocate dashboard --port 8390` "
                             "(your jobs in full, others' as `collocate ls` shows them)") from None
    full = f"{url}?token={token}" if token else url
    echo(json.dumps({"url": full, "token": bool(token)}) if fmt == "json" else full)
