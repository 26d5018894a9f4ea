"""What a user submits, validated once at the edge: the command, where and how it runs.

``Job`` (``collocate.model``) is what the scheduler sees; ``JobSpec`` is what the daemon keeps
beside it to launch the job. ``validate_submit`` turns an API request into both, or raises an
``InputError`` naming the field and the fix, before anything is stored.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from collocate.daemon.protocol import whole_number
from collocate.errors import InputError
from collocate.units import parse_mib

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

    @property
    def signature(self) -> str:
        """Same command, arguments and working directory = same job, for memory history."""
        key = json.dumps([list(self.argv), self.cwd], separators=(",", ":"))
        return hashlib.sha256(key.encode()).hexdigest()[:32]

    @property
    def program(self) -> str:
        """Same script (or module) in the same working directory, whatever its arguments: the
        points of a sweep. Their GPU activity is a better guess for each other than nothing;
        their memory is not (a batch size changes it), so only activity is shared."""
        key = json.dumps([program_token(self.argv), self.cwd], separators=(",", ":"))
        return hashlib.sha256(key.encode()).hexdigest()[:32]

    def to_json(self) -> str:
        d = asdict(self)
        d["argv"] = list(self.argv)
        return json.dumps(d)

    @classmethod
    def from_json(cls, text: str) -> JobSpec:
        d = json.loads(text)
        d["argv"] = tuple(d["argv"])
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


_LAUNCHERS = re.compile(r"^(python[0-9.]*|pypy[0-9.]*|bash|sh|zsh|torchrun|accelerate|deepspeed|uv|nohup|env)$")


def program_token(argv: list[str] | tuple[str, ...]) -> str:
    """The script or module a command runs, as written: past launchers such as ``python``,
    ``torchrun`` or ``bash``, so ``python train.py --lr 0.1`` and ``--lr 0.2`` give ``train.py``."""
    if not _LAUNCHERS.match(os.path.basename(argv[0])):
        return argv[0]
    rest = list(argv[1:])
    for i, arg in enumerate(rest):
        if arg == "-m" and i + 1 < len(rest):
            return rest[i + 1]
        if arg.endswith((".py", ".sh")):
            return arg
    plain = [a for a in rest if not a.startswith("-") and "=" not in a and a not in ("run", "launch")]
    return plain[0] if plain else argv[0]


def default_name(argv: list[str] | tuple[str, ...]) -> str:
    """A job's name when none is given: the script or module a launcher runs, so ``collocate
    ls`` shows ``train.py`` rather than a column of ``python``."""
    token = program_token(argv)
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
    checks as that user (a throwaway ``sh`` with their uid/gid and no supplementary groups),
    so it neither admits a root-only directory nor tells whether one exists."""
    if os.geteuid() == 0 and uid not in (-1, 0):
        try:
            usable = subprocess.run(
                ["/bin/sh", "-c", 'cd -- "$1"', "sh", cwd], user=uid, group=gid if gid >= 0 else None,
                extra_groups=[], env={}, cwd="/", stdin=subprocess.DEVNULL,
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
    gpus = _int(args.get("gpus", 1), "--gpus", low=1)
    mem = args.get("mem")
    mem_mib = None if mem in (None, "") else parse_mib(mem)
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
    priority = _int(args.get("priority", 0), "--priority")
    source, uncertainty = str(args.get("mem_source") or "declared"), args.get("mem_uncertainty", 0.0)
    if source != "declared" and not source.startswith("static-"):
        raise InputError(f"unknown memory source {source!r}", hint="declared, or static-<method>")
    if not isinstance(uncertainty, int | float) or not 0 <= uncertainty <= 10:
        raise InputError(f"memory uncertainty must be a number in [0, 10], got {uncertainty!r}")
    dataset, factory = _dataset(args.get("dataset"), args.get("dataset_factory"))
    spec = JobSpec(tuple(argv), cwd, env, uid, gid, user, retry_failures=retries is not None,
                   dataset=dataset, dataset_factory=factory, submit_key=submit_key(args.get("key")))
    return SubmitRequest(spec, gpus, mem_mib, name, priority, max_retries, source, float(uncertainty),
                         _after(args.get("after")))


def submit_key(value: Any) -> str | None:
    """The idempotency key in form: 8-128 of letters, digits, ``-`` and ``_``, or none."""
    if value in (None, ""):
        return None
    if not isinstance(value, str) or not _KEY.match(value):
        raise InputError(f"submit key {value!r} is not 8-128 letters, digits, '-' or '_'",
                         hint="collocate clients make one per request; send a random hex string")
    return value


def _after(value: Any) -> tuple[str, ...]:
    """``--after`` ids in form only; whether they exist and can still succeed is the scheduler's call."""
    if value in (None, []):
        return ()
    if not isinstance(value, list) or len(value) > MAX_AFTER:
        raise InputError(f"--after takes at most {MAX_AFTER} job ids", hint="e.g. --after 12 (repeatable)")
    try:
        ids = [str(whole_number(v, "--after", low=1)) for v in value if isinstance(v, str)]
    except InputError:
        ids = []
    if len(ids) != len(value):
        raise InputError(f"--after takes job ids, got {value!r}", hint="e.g. --after 12 (repeatable)")
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
