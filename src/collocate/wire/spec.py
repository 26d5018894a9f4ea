"""What a user submits, validated once at the edge: the command, where and how it runs.

``Job`` (``collocate.core.model``) is what the scheduler sees; ``JobSpec`` is what the daemon keeps
beside it to launch the job. ``validate_submit`` turns an API request into both, or raises an
``InputError`` naming the field and the fix, before anything is stored.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from collocate.common.errors import InputError
from collocate.common.units import parse_duration, parse_mib
from collocate.core.identity import LAUNCHERS, JobKeys, program_token
from collocate.wire.protocol import whole_number
from collocate.wire.schema import MAX_TIME_LIMIT_S, MIN_TIME_LIMIT_S

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Set by the daemon for every launch; a user's value would be overwritten, so refuse it.
RESERVED_ENV = ("CUDA_VISIBLE_DEVICES", "COLLOCATE_JOB_ID", "COLLOCATE_ATTEMPT", "COLLOCATE_DATASET",
                "COLLOCATE_SHARE_DIR")
_FACTORY = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
MAX_RETRIES = 100

MAX_AFTER = 1000  # dependencies of one job
_KEY = re.compile(r"^[A-Za-z0-9_-]{8,128}$")


@dataclass(frozen=True, slots=True)
class JobSpec:
    """How to launch a job: argv (never through a shell), cwd, environment, owner."""

    argv: tuple[str, ...]
    cwd: str
    env: dict[str, str] = field(default_factory=dict)
    uid: int = -1  # the submitting user (socket peer credentials); -1 = the daemon's user
    gid: int = -1
    user: str = ""
    retry_failures: bool = False  # the user passed --retries: retry non-OOM failures too
    # A shared dataset (``--dataset``): the daemon runs one producer per name for all its jobs.
    # The factory is stored on every job (filled in from earlier jobs when omitted), so a
    # restarted daemon can start the producer again from any one job's spec alone.
    dataset: str | None = None
    dataset_factory: str | None = None
    # The client's idempotency key: a submit retried after a broken connection gets the job
    # its first try stored (``Store.job_for_key``) instead of a duplicate.
    submit_key: str | None = None
    # Other members may see its command, working directory and logs (``submit --public``);
    # by default they see what ``squeue`` shows (``wire/rights.py``).
    public: bool = False
    # Run when the job ends (``submit --notify``), as the job's user, in its cwd and
    # environment, with the job's id, name, state and reason in COLLOCATE_JOB_* and a one-line
    # summary on stdin (``daemon/notify.py``). An argv list, never through a shell.
    notify: tuple[str, ...] = ()
    # ``submit --no-mem-fence``: its GPU memory is not capped at what it committed (``Job.mem_fence``).
    no_mem_fence: bool = False
    # ``submit --output/--error``: absolute path patterns (``wire/outputs.py``: ``%j``, ...)
    # of the files the job's stdout and stderr go to as well, written as its user; without
    # ``error``, stderr goes to ``output`` too (sbatch's way); ``collocate logs`` keeps both.
    output: str | None = None
    error: str | None = None

    @property
    def keys(self) -> JobKeys:
        """Its identity (history: the same command up to seeds, output paths and run names) and
        its family (siblings: the same non-numeric, non-path arguments); ``collocate.core.identity``."""
        return JobKeys.of(self.argv, self.cwd)

    def to_json(self) -> str:
        d = asdict(self)
        d["argv"], d["notify"] = list(self.argv), list(self.notify)
        return json.dumps(d)

    @classmethod
    def from_json(cls, text: str) -> JobSpec:
        d = json.loads(text)
        d["argv"] = tuple(d["argv"])
        d["notify"] = tuple(d.get("notify") or ())
        return cls(**d)


@dataclass(frozen=True, slots=True)
class SubmitRequest:
    """A validated submission: the spec plus the scheduling fields of the future ``Job``."""

    spec: JobSpec
    gpus: int
    mem_mib: float | None
    name: str
    priority: int
    max_retries: int
    mem_source: str = "declared"
    mem_uncertainty: float = 0.0
    after: tuple[str, ...] = ()  # job ids that must end done first
    after_any: tuple[str, ...] = ()  # job ids that must end first, in any state
    after_notok: tuple[str, ...] = ()  # job ids that must end other than done first
    time_limit_s: float | None = None
    hold: bool = False  # submitted held (``submit --hold``)
    nodes: int = 1  # ``gpus`` on each of this many nodes (``submit --nodes``)
    #: ``submit --sweep``: "new" for a sweep's first job, the first job's id for the others;
    #: "" outside a sweep. ``sweep_max``: how many of it may run at once (0: no bound).
    sweep: str = ""
    sweep_max: int = 0


_SHELLS = re.compile(r"^(bash|sh|zsh|dash)$")
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")  # a shell's ``NAME=VALUE`` prefix


def default_name(argv: list[str] | tuple[str, ...]) -> str:
    """A job's name when none is given: the script or module a launcher runs, so ``collocate
    ls`` shows ``train.py`` rather than a column of ``python``. A name is what every member of a
    shared daemon sees (``wire/rights.py``), so inline code never becomes one: ``bash -c
    'SCRIPT'`` is named by the script's first word (its arguments and a sweep's
    ``{placeholders}`` stay out: ``sleep[lr=0.1]``), ``python -c CODE`` is ``python -c``, and
    ``NAME=VALUE`` words (an inline ``TOKEN=...``) are never part of a name."""
    if "-c" in argv[1:-1] and LAUNCHERS.match(os.path.basename(argv[0])):
        if not _SHELLS.match(os.path.basename(argv[0])):
            return f"{os.path.basename(argv[0])} -c"
        words = [w for w in argv[argv.index("-c", 1) + 1].split()
                 if not _ASSIGNMENT.match(w) and w not in ("env", "export")]
        token = words[0] if words else argv[0]
    else:
        token = program_token(argv)
    if "=" in token:  # never a NAME=VALUE word (``TOKEN=... sleep``'s secret), issue 36
        token = argv[0]
    return token if "/" not in token else os.path.basename(token)


def parse_env(items: list[str] | tuple[str, ...]) -> dict[str, str]:
    """``["K=V", ...]`` as a dict; a clear error for a malformed item."""
    env: dict[str, str] = {}
    for item in items:
        name, sep, value = str(item).partition("=")
        if not sep or not _ENV_NAME.match(name):
            raise InputError(
                f"cannot read --env {item!r}",
                hint="write --env NAME=VALUE with NAME made of letters, digits and _",
            )
        env[name] = value
    return env


def check_env(env: dict[str, str]) -> None:
    """What ``execve`` would refuse, refused now: a name that is empty or holds ``=`` or NUL, a
    value with NUL. (``--env`` names are stricter still; the submitter's own environment may
    hold any name the OS accepts.)"""
    for name, value in env.items():
        if not name or "=" in name or "\0" in name:
            raise InputError(f"environment variable name {name!r} cannot be passed to a process",
                             hint="names must be non-empty, without '=' or NUL bytes")
        if "\0" in value:
            raise InputError(f"environment variable {name} holds a NUL byte",
                             hint="remove it; a process environment cannot carry NUL bytes")


def check_cwd(cwd: str, uid: int, gid: int) -> None:
    """The working directory must exist and be enterable *by the submitter*. A root daemon
    checks as that user (a throwaway ``sh`` with their uid/gid and their groups, as the job
    will have them: ``isolate.user_groups``), so it neither admits a root-only directory nor
    tells whether one exists."""
    if os.geteuid() == 0 and uid not in (-1, 0):
        import subprocess  # here: the client imports this module (default_name), not subprocess

        from collocate.node.isolate import user_groups

        try:
            usable = subprocess.run(
                ["/bin/sh", "-c", 'cd -- "$1"', "sh", cwd], user=uid, group=gid if gid >= 0 else None,
                extra_groups=user_groups(uid, gid), env={}, cwd="/", stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=10).returncode == 0
        except (OSError, subprocess.SubprocessError):
            usable = False
    else:
        usable = Path(cwd).is_dir() and os.access(cwd, os.X_OK)
    if not usable:
        raise InputError(f"working directory {cwd} does not exist or you cannot enter it",
                         hint="pass an existing --cwd that you can enter")


def validate_submit(args: dict[str, Any], *, uid: int, gid: int, user: str) -> SubmitRequest:
    """Check a ``submit`` request's fields; raises ``InputError`` on the first bad one."""
    argv = args.get("argv")
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise InputError(
            "empty command",
            hint="put the command after --, e.g. collocate submit --mem 6GiB -- python train.py",
        )
    if not argv[0].strip():
        raise InputError("the command's program name is empty", hint="check the text after --")
    if any("\0" in a for a in argv):
        raise InputError("the command contains a NUL byte, which no program can receive",
                         hint="remove it from the arguments after --")
    cwd = args.get("cwd")
    if not isinstance(cwd, str) or not os.path.isabs(cwd) or "\0" in cwd:
        raise InputError(f"--cwd must be an absolute directory, got {cwd!r}")
    check_cwd(cwd, uid, gid)
    gpus = _int(args.get("gpus", 1), "--gpus", low=0)
    nodes = _int(args.get("nodes", 1), "--nodes", low=1, high=1024)
    if gpus == 0:
        _check_cpu_job(args, nodes)
    if nodes > 1 and args.get("dataset"):
        raise InputError("--dataset serves the jobs of one node from its producer; a job on "
                         "--nodes N > 1 cannot use one", hint="drop --dataset, or --nodes")
    mem = args.get("mem")
    mem_mib = None if mem is None or mem == "" else parse_mib(mem)
    if mem_mib is not None and mem_mib <= 0:
        raise InputError(f"--mem must be more than 0, got {mem!r}", hint="e.g. --mem 6GiB")
    retries = args.get("retries")
    max_retries = 3 if retries is None else _int(retries, "--retries", low=0, high=MAX_RETRIES)
    items = args.get("env") or []
    base_env = args.get("base_env") or {}
    if not isinstance(items, list) or not isinstance(base_env, dict):
        raise InputError("env must be a list of NAME=VALUE strings, base_env an object")
    user_env = parse_env(items)
    for reserved in RESERVED_ENV:
        if reserved in user_env:
            raise InputError(f"--env {reserved} is set by the daemon for each launch", hint="drop it")
    env = {str(k): str(v) for k, v in base_env.items() if k not in RESERVED_ENV}
    env.update(user_env)
    check_env(env)
    name = str(args.get("name") or default_name(argv))[:200]
    from collocate.core.model import PRIORITY_MAX  # here: the client imports this module, not model's

    priority = _int(args.get("priority", 0), "--priority", low=-PRIORITY_MAX, high=PRIORITY_MAX)
    source, uncertainty = str(args.get("mem_source") or "declared"), args.get("mem_uncertainty", 0.0)
    if source != "declared" and not source.startswith("static-"):
        raise InputError(f"unknown memory source {source!r}", hint="declared, or static-<method>")
    if not isinstance(uncertainty, int | float) or not 0 <= uncertainty <= 10:
        raise InputError(f"memory uncertainty must be a number in [0, 10], got {uncertainty!r}")
    dataset, factory = _dataset(args.get("dataset"), args.get("dataset_factory"))
    from collocate.wire.outputs import check_template

    output = check_template(args.get("output"), "--output", cwd)
    error = check_template(args.get("error"), "--error", cwd)
    spec = JobSpec(tuple(argv), cwd, env, uid, gid, user, retry_failures=retries is not None,
                   dataset=dataset, dataset_factory=factory, submit_key=submit_key(args.get("key")),
                   public=bool(args.get("public")), notify=_notify(args.get("notify")),
                   no_mem_fence=bool(args.get("no_mem_fence")), output=output, error=error)
    sweep, sweep_max = _sweep(args.get("sweep"), args.get("sweep_max"))
    return SubmitRequest(spec, gpus, mem_mib, name, priority, max_retries, source, float(uncertainty),
                         _after(args.get("after")), _after(args.get("after_any"), "--after-any"),
                         _after(args.get("after_notok"), "--after-notok"),
                         _time_limit(args.get("time")), bool(args.get("hold")), nodes, sweep, sweep_max)


MAX_SWEEP_MAX = 10_000  # a sweep has at most this many jobs (``client/sweep.py``)


def _sweep(sweep: Any, most: Any) -> tuple[str, int]:
    """The sweep fields in form; whether a first job's id names a sweep of the same user is
    the daemon's call (``api.op_submit``)."""
    sweep = "" if sweep in (None, "") else sweep
    most = 0 if most in (None, 0) else _int(most, "--sweep-max", low=1, high=MAX_SWEEP_MAX)
    if sweep == "":
        if most:
            raise InputError("--sweep-max bounds a sweep", hint="give --sweep NAME=VALUES too, or drop --sweep-max")
        return "", 0
    if sweep != "new":
        sweep = str(_int(sweep, "sweep", low=1))
    return sweep, most


def _check_cpu_job(args: dict[str, Any], nodes: int) -> None:
    """A CPU job (``--gpus 0``) runs on one machine with no GPU: no GPU memory to declare, no
    dataset producer to read from, no other nodes."""
    if nodes > 1:
        raise InputError("a CPU job (--gpus 0) runs on one node", hint="drop --nodes, or give --gpus")
    if args.get("mem") not in (None, "") or args.get("mem_source") not in (None, "", "declared"):
        raise InputError("--mem and --estimate are GPU memory; a CPU job (--gpus 0) holds none",
                         hint="drop --mem/--estimate, or give --gpus 1")
    if args.get("dataset"):
        raise InputError("--dataset serves training jobs on GPUs; a CPU job (--gpus 0) cannot use one",
                         hint="drop --dataset, or give --gpus 1")


def _time_limit(value: Any) -> float | None:
    """``--time``: Slurm's forms (``units.parse_duration``), or seconds as a number (the API)."""
    if value in (None, ""):
        return None
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise InputError(f"--time must be a duration, got {value!r}", hint="e.g. --time 2:00:00")
    seconds = float(value) if isinstance(value, int | float) else parse_duration(value)
    if not MIN_TIME_LIMIT_S <= seconds <= MAX_TIME_LIMIT_S:
        raise InputError(f"--time must be at least {MIN_TIME_LIMIT_S:g} s and at most 365 days, got {value!r}",
                         hint="e.g. --time 30:00 (30 minutes) or --time 2:00:00")
    return seconds


def _notify(value: Any) -> tuple[str, ...]:
    if value in (None, "", []):
        return ()
    if not isinstance(value, list) or not value or not all(isinstance(a, str) and a and "\0" not in a
                                                           for a in value):
        raise InputError(f"--notify takes a command, got {value!r}",
                         hint="e.g. --notify 'mail -s collocate you@lab' (its stdin is a summary)")
    return tuple(value)


def submit_key(value: Any) -> str | None:
    """The idempotency key in form: 8-128 of letters, digits, ``-`` and ``_``, or none."""
    if value in (None, ""):
        return None
    if not isinstance(value, str) or not _KEY.match(value):
        raise InputError(f"submit key {value!r} is not 8-128 letters, digits, '-' or '_'",
                         hint="collocate clients make one per request; send a random hex string")
    return value


def _after(value: Any, option: str = "--after") -> tuple[str, ...]:
    """``--after``-like ids in form only; whether they exist and can still be met is the
    scheduler's call."""
    if value in (None, []):
        return ()
    if not isinstance(value, list) or len(value) > MAX_AFTER:
        raise InputError(f"{option} takes at most {MAX_AFTER} job ids", hint=f"e.g. {option} 12 (repeatable)")
    try:
        ids = [str(whole_number(v, option, low=1)) for v in value if isinstance(v, str)]
    except InputError:
        ids = []
    if len(ids) != len(value):
        raise InputError(f"{option} takes job ids, got {value!r}", hint=f"e.g. {option} 12 (repeatable)")
    return tuple(dict.fromkeys(ids))


def _dataset(name: Any, factory: Any) -> tuple[str | None, str | None]:
    """Check ``--dataset``/``--dataset-factory`` in form only; whether a factory is needed (the
    first job of a dataset) or conflicts with a running one is the daemon's call (``datasets``)."""
    from collocate.share.naming import validate_name

    name = None if name in (None, "") else name
    factory = None if factory in (None, "") else factory
    if name is None:
        if factory is not None:
            raise InputError("--dataset-factory needs --dataset",
                             hint="name the shared dataset, e.g. --dataset cifar-train")
        return None, None
    validate_name(name)
    if factory is not None and (not isinstance(factory, str) or not _FACTORY.match(factory)):
        raise InputError(f"--dataset-factory {factory!r} is not module:factory",
                         hint="e.g. --dataset-factory my_project.data:make_train_loader")
    return name, factory


def _int(value: Any, option: str, *, low: int | None = None, high: int | None = None) -> int:
    return whole_number(value, option, low=low, high=high)


#: What ``collocate update`` may change on a pending job (Slurm's ``scontrol update``).
UPDATABLE = ("mem", "time", "name", "after", "after_any", "after_notok", "priority")


def validate_update(args: dict[str, Any]) -> dict[str, Any]:
    """The ``Job`` fields an ``update`` request changes, checked as ``validate_submit`` checks
    them; a field the request leaves out (or sends as None) keeps its value."""
    given = {k: args[k] for k in UPDATABLE if args.get(k) is not None}
    if not given:
        raise InputError("nothing to change", hint="give --mem, --time, --name, --after, --after-any, "
                         "--after-notok or --nice")
    changes: dict[str, Any] = {}
    if "mem" in given:  # a declaration now: the owner knows better than any estimate
        mem_mib = parse_mib(given["mem"]) if isinstance(given["mem"], str) else None
        if mem_mib is None or mem_mib <= 0:
            raise InputError(f"--mem must be an amount with a unit, got {given['mem']!r}", hint="e.g. --mem 6GiB")
        changes.update(mem_mib=mem_mib, mem_source="declared", mem_uncertainty=0.0)
    if "time" in given:
        changes["time_limit_s"] = _time_limit(given["time"])
    if "name" in given:
        name = str(given["name"]).strip()
        if not name:
            raise InputError("--name is empty", hint="give the job a name, e.g. --name baseline")
        changes["name"] = name[:200]
    for key, option in (("after", "--after"), ("after_any", "--after-any"), ("after_notok", "--after-notok")):
        if key in given:
            changes[key] = _after(given[key], option)
    if "priority" in given:
        from collocate.core.model import PRIORITY_MAX

        changes["priority"] = _int(given["priority"], "--priority", low=-PRIORITY_MAX, high=PRIORITY_MAX)
    return changes
