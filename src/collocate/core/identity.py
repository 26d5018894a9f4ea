"""When two submissions are "the same training job", and when they are siblings.

What collocate learns of a job (its memory peak, its GPU activity) is worth something only if the
next submission finds it. A lab's resubmission of "the same job" rarely repeats its command
exactly: it changes the output path, the seed or the run name, not the model or the batch size
(shared notes, gpu-facts.md). So two keys, both pure functions of the command and its working
directory:

* **identity** (``JobKeys.identity``): the history key of memory and activity. Same script (or
  module), same working directory, same arguments, except the *values* of options that name a
  run rather than shape it: seeds, output and logging paths, run and experiment names (the
  option names themselves are kept, and so is every other value, a batch size or a model name
  included). ``python train.py --job mlp --out runs/a --seed 1`` and ``... --out runs/b --seed 2``
  are one job; ``--batch-size 64`` and ``--batch-size 128`` are two.
* **family** (``JobKeys.family``): the siblings whose measured activity is a prior for a new
  command (a sweep's points). Same script and working directory and the same *non-numeric,
  non-path* arguments: the four points of an MLP sweep over ``--lr`` and ``--hidden`` are one
  family, ``--job lstm`` and ``--job mlp`` are two. Memory is never shared within a family (a
  batch size changes it); activity is, shrunk toward the prior by how many siblings agree
  (``collocate.core.belief.family_prior``).

The rule reads options as ``--name value``, ``--name=value`` and Hydra-style ``name=value``; a
token after an option that does not itself start with ``-`` (or is a negative number) is its
value. It is a heuristic, so it errs towards keeping: an option not named below stays in both
keys, so at worst a resubmission is treated as a new job, never two different jobs as one.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass

#: Launchers whose first script or module argument is the program: ``python train.py`` runs
#: ``train.py``.
LAUNCHERS = re.compile(r"^(python[0-9.]*|pypy[0-9.]*|bash|sh|zsh|torchrun|accelerate|deepspeed|uv|nohup|env)$")

#: Option names (lower case, ``-`` as ``_``, the last part of a dotted Hydra key) whose value
#: names a run rather than shapes it: left out of both keys.
RUN_NAMING = re.compile(
    r"^(seed|random_seed|rng_seed|manual_seed|[a-z_]*_seed"
    r"|(out|output|outputs|save|log|logging|ckpt|checkpoint|checkpoints|result|results|tensorboard|tb)"
    r"(_?dir|_?path|_?file|_name|_root|_folder|_prefix)?"
    r"|outdir|logdir|savedir|wandb_[a-z_]+|run|run_name|run_id|run_dir|exp|exp_name|exp_dir"
    r"|experiment|experiment_name|experiment_dir|name|tag|tags|notes|comment|project|job_name)$")

_NUMBER = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")
_PATH_SUFFIX = re.compile(r"\.(py|sh|ya?ml|json|toml|cfg|ini|txt|csv|tsv|pt|pth|ckpt|bin|safetensors"
                          r"|npz|npy|h5|hdf5|pkl|parquet|tar|zip|gz|log)$", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class JobKeys:
    """A command's identity and family (see the module docstring), as short hashes."""

    identity: str
    family: str

    @classmethod
    def of(cls, argv: Sequence[str], cwd: str) -> JobKeys:
        program = program_token(argv)
        args = _arguments(argv)
        kept = [(name, value) for name, value in args if not _names_a_run(name)]
        identity = [program, cwd, kept]
        family = [program, cwd, [(name, value) for name, value in kept
                                 if value is None or not (_is_number(value) or _is_path(value))]]
        return cls(_digest(identity), _digest(family))


def program_token(argv: Sequence[str]) -> str:
    """The script or module a command runs, as written: past launchers such as ``python``,
    ``torchrun`` or ``bash``, so ``python train.py --lr 0.1`` and ``--lr 0.2`` give ``train.py``."""
    if not LAUNCHERS.match(os.path.basename(argv[0])):
        return argv[0]
    rest = list(argv[1:])
    for i, arg in enumerate(rest):
        if arg == "-m" and i + 1 < len(rest):
            return rest[i + 1]
        if arg.endswith((".py", ".sh")):
            return arg
    plain = [a for a in rest if not a.startswith("-") and "=" not in a and a not in ("run", "launch")]
    return plain[0] if plain else argv[0]


def _arguments(argv: Sequence[str]) -> list[tuple[str | None, str | None]]:
    """The arguments after the program, as (option name, value) pairs; a positional argument
    has no name, a flag no value. Launcher options before the program are left out."""
    program = program_token(argv)
    tokens = list(argv)
    start = tokens.index(program) + 1 if program in tokens else 1
    pairs: list[tuple[str | None, str | None]] = []
    rest = tokens[start:]
    i = 0
    while i < len(rest):
        token = rest[i]
        if token.startswith("-") and not _is_number(token) and token != "-":
            name, eq, value = token.lstrip("-").partition("=")
            if not eq and i + 1 < len(rest) and (not rest[i + 1].startswith("-") or _is_number(rest[i + 1])):
                value, i = rest[i + 1], i + 1
            pairs.append((_option(name), value if (eq or value) else None))
        elif "=" in token and not token.startswith("="):  # Hydra-style key=value
            name, _, value = token.partition("=")
            pairs.append((_option(name), value))
        else:
            pairs.append((None, token))
        i += 1
    return pairs


def _option(name: str) -> str:
    return name.lower().replace("-", "_").lstrip("+~")


def _names_a_run(name: str | None) -> bool:
    """Whether an option names a run: its name, or the last one or two parts of a dotted
    (Hydra) key such as ``trainer.seed`` or ``hydra.run.dir``."""
    if name is None:
        return False
    parts = name.split(".")
    return any(RUN_NAMING.match(candidate) for candidate in (parts[-1], "_".join(parts[-2:])))


def _is_number(value: str) -> bool:
    return all(_NUMBER.match(part) for part in value.split(",")) if value else False


def _is_path(value: str) -> bool:
    return "/" in value or os.sep in value or _PATH_SUFFIX.search(value) is not None


def _digest(key: object) -> str:
    import hashlib  # here: `submit` names jobs with this module but seldom digests (OpenSSL's start)

    return hashlib.sha256(json.dumps(key, separators=(",", ":")).encode()).hexdigest()[:32]
