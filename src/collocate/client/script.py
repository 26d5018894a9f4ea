"""``collocate submit train.sh``: a job script, with its options in ``#COLLOCATE`` lines at its
top, as ``sbatch`` reads ``#SBATCH`` lines.

The lines are read where sbatch reads them: after the shebang, among the comments and blank
lines before the first command; a ``#COLLOCATE`` line further down is a comment. Each line is
read by the very parser of the command line (``submit``'s click command), so there is one
grammar, and an option given on the command line wins over the script's. The script runs as
written: by itself when it is executable, else by the interpreter its shebang names, else
``bash`` (the script is read when the job starts, not copied at submit as sbatch does).
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field
from typing import Any

from collocate.common.cli_errors import _is
from collocate.common.errors import InputError

DIRECTIVE = "#COLLOCATE"
_HEAD_BYTES = 64 * 1024  # directives live in a script's first lines
_SCRIPT_ONLY = ("command",)  # what a directive line may not set


@dataclass(frozen=True, slots=True)
class Script:
    """A job script: the argv that runs it and its directive lines (line number, words)."""

    argv: tuple[str, ...]
    lines: tuple[tuple[int, tuple[str, ...]], ...]
    path: str
    #: option (``--mem``) -> the line that set it, for errors found later (``blame``)
    where: dict[str, int] = field(default_factory=dict)
    #: ``#SBATCH`` lines among the directives, which collocate does not read (``sbatch_note``)
    sbatch: tuple[int, ...] = ()

    def sbatch_note(self) -> str | None:
        """What to tell a Slurm user whose script still speaks to sbatch: its ``#SBATCH``
        lines are comments here, silently dropping ``--mem`` or ``--time`` otherwise."""
        if not self.sbatch:
            return None
        where = ", ".join(map(str, self.sbatch[:5])) + (", ..." if len(self.sbatch) > 5 else "")
        return (f"note: {self.path}: #SBATCH lines ({where}) are not read; write the options as "
                f"{DIRECTIVE} lines (docs/slurm.md maps each) or on the command line")

    def blame(self, exc: InputError) -> InputError:
        """``exc`` with the script's file and line in front when it is about an option a
        directive set (``--mem 2 has no unit`` -> ``train.sh:3: --mem 2 has no unit``)."""
        message = str(exc.args[0])
        for flag, n in self.where.items():
            if flag in message:
                return InputError(f"{self.path}:{n}: {message}", hint=exc.hint)
        return exc


def script_of(command: list[str] | None) -> Script | None:
    """The script ``command`` runs when its first word names a file here (``train.sh``,
    ``./train.sh``, ``jobs/a.sh``), else None (``python train.py``: a program on the PATH).
    A binary (``/usr/bin/python3 x.py``) is run as it is and has no directives."""
    if not command or not os.path.isfile(command[0]):
        return None
    path = command[0]
    try:
        with open(path, "rb") as f:
            head = f.read(_HEAD_BYTES)
    except OSError as exc:
        raise InputError(f"cannot read the job script {path}: {exc.strerror}",
                         hint="check the file's permissions") from None
    try:
        text = head.decode()
    except UnicodeDecodeError:
        text = None  # a program, not a script
    executable = os.access(path, os.X_OK)
    if text is None:
        return Script(tuple(command), (), path) if executable else None
    lines = text.splitlines()
    shebang = lines[0][2:].strip() if lines and lines[0].startswith("#!") else None
    if executable:
        argv = tuple(command)
    elif shebang:
        argv = (*shebang.split(), *command)  # what the kernel would run
    else:
        argv = ("bash", *command)
    sbatch: list[int] = []
    return Script(argv, tuple(_directives(path, lines, sbatch)), path, sbatch=tuple(sbatch))


def _directives(path: str, lines: list[str], sbatch: list[int]) -> list[tuple[int, tuple[str, ...]]]:
    """The ``#COLLOCATE`` lines at the top, as (line number, words); ``#SBATCH`` lines' numbers
    added to ``sbatch``."""
    found = []
    for n, line in enumerate(lines, start=1):
        stripped = line.strip()
        if n == 1 and stripped.startswith("#!"):
            continue
        if stripped and not stripped.startswith("#"):
            break  # the first command: sbatch stops reading directives here too
        if stripped.startswith("#SBATCH") and stripped[7:8] in ("", " ", "\t"):
            sbatch.append(n)
        if not stripped.startswith(DIRECTIVE):
            continue
        rest = stripped[len(DIRECTIVE):]
        if rest and not rest[0].isspace():
            continue  # #COLLOCATEX: another tool's word
        try:
            words = shlex.split(rest, comments=True)
        except ValueError as exc:
            raise InputError(f"{path}:{n}: cannot read {stripped!r}: {str(exc).lower()}",
                             hint="close every quote, e.g. #COLLOCATE --name 'my run'") from None
        if words:
            found.append((n, tuple(words)))
    return found


def merged_params(ctx: Any, script: Script) -> dict[str, Any]:
    """``submit``'s parameters with the script's directives filled in where the command line
    left a parameter at its default; the command becomes the argv that runs the script."""
    command = ctx.command
    params = dict(ctx.params)
    from_script: dict[str, Any] = {}
    for n, words in script.lines:  # line by line first: an error names its line
        parsed = _parse(command, words, f"{script.path}:{n}")
        for name in parsed:
            script.where.setdefault(_flag(command, name), n)
            if name in _SCRIPT_ONLY:
                raise InputError(f"{script.path}:{n}: a {DIRECTIVE} line takes options only, "
                                 f"got {' '.join(words)!r}",
                                 hint=f"write the command below the {DIRECTIVE} lines, as the script's body")
    if script.lines:  # then together: repeated options (--env, --after) add up across lines
        every = [w for _, words in script.lines for w in words]
        from_script = _parse(command, every, script.path)
    for name, value in from_script.items():
        source = ctx.get_parameter_source(name)
        if source is None or source.name == "DEFAULT":
            params[name] = value
        else:  # the command line's value wins: the script's line is not what an error is about
            script.where.pop(_flag(command, name), None)
    params["command"] = script.argv
    return params


def _flag(command: Any, name: str) -> str:
    opts = next((p.opts for p in command.params if p.name == name), [name])
    return max(opts, key=len)


def _parse(command: Any, words: tuple[str, ...] | list[str], where: str) -> dict[str, Any]:
    """The parameters ``words`` set, read by the command's own parser."""
    if "--help" in words:
        raise InputError(f"{where}: --help is not an option for a job", hint=f"drop it from the {DIRECTIVE} line")
    try:
        ctx = command.make_context("submit", list(words), resilient_parsing=False)
    except Exception as exc:  # Click's UsageError, or Typer's vendored copy of it
        if not _is(exc, "UsageError"):
            raise
        from collocate.common.slurm_words import hint_for

        slurms = hint_for(exc) if _is(exc, "NoSuchOption") else None
        raise InputError(f"{where}: {exc.format_message()}",  # type: ignore[attr-defined]
                         hint=slurms or f"{DIRECTIVE} lines take submit's options, e.g. "
                              f"{DIRECTIVE} --mem 6GiB --time 2:00:00 (`collocate submit --help`)") from None
    return {name: value for name, value in ctx.params.items()
            if (source := ctx.get_parameter_source(name)) is not None and source.name == "COMMANDLINE"}
