"""How every command-line entry point reports a mistake: ``error: ...`` and a hint, exit 2.

Two kinds of mistake end here. A ``CollocateError`` raised by a command (or answered by the
daemon) already says what to do. A command line Typer cannot read (``--priority abc``, an unknown
option, a missing argument) would otherwise get the parsing library's own box, whose wording
changes between Typer releases ("Input should be a valid integer, unable to parse string as an
integer"); here it says which option wants what, from the command's own type annotations.
Everything printed passes through ``safetext.printable``: the message may quote a job name.
"""

from __future__ import annotations

import contextlib
import enum
import inspect
import os
import sys
import types
import typing
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from collocate.common.errors import CollocateError
from collocate.common.safetext import printable

if TYPE_CHECKING:
    import typer

PROGRAM = "collocate"


def run(app: typer.Typer, args: Sequence[str] | None = None, *,
        commands: Iterable[str] | None = None) -> None:
    """Run a Typer app; a user error prints its message and hint (no traceback) and exits 2.
    ``commands``: the app's command names, where it registers them lazily (``collocate.cli``)."""
    argv = list(sys.argv[1:] if args is None else args)
    names = set(commands) if commands is not None else {c.name for c in app.registered_commands if c.name}
    with reported(argv, names):
        code = app(argv, prog_name=PROGRAM, standalone_mode=False)
    sys.exit(code if isinstance(code, int) else 0)


@contextlib.contextmanager
def reported(argv: Sequence[str], commands: set[str]) -> Iterator[None]:
    """How a command's failure ends the process, for Typer's path (``run``) and the fast one
    (``cli_fast``) alike. Ctrl-C ends as Click ends it: a new line, ``Aborted.``, exit 1."""
    try:
        yield
    except CollocateError as exc:
        _fail(str(exc))
    except BrokenPipeError:  # `collocate ls | head`: quiet, and no second error at exit's flush
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
    except (KeyboardInterrupt, EOFError):  # the fast path's; Click makes these an Abort
        _aborted(newline=True)
    except Exception as exc:
        if _is(exc, "UsageError"):
            _fail(usage_message(exc, argv, commands))
        if _is(exc, "Abort"):  # Ctrl-C or end of input at a prompt
            _aborted(newline=False)
        raise


def _aborted(*, newline: bool) -> typing.NoReturn:
    sys.stderr.write("\nAborted.\n" if newline else "Aborted.\n")
    sys.stderr.flush()
    sys.exit(1)


def _fail(message: str) -> typing.NoReturn:
    import typer  # an error may take the time; colours as Typer decides them

    typer.secho(f"error: {printable(message, multiline=True)}", fg=typer.colors.RED, err=True)
    sys.exit(2)


def _is(exc: BaseException, name: str) -> bool:
    """Typer raises Click's exception classes, or (since 0.2x) its vendored copies of them."""
    return any(cls.__name__ == name for cls in type(exc).__mro__)


def usage_message(exc: Exception, argv: Sequence[str], commands: set[str]) -> str:
    """``--priority takes a whole number, not 'abc'`` and a hint naming the command's --help."""
    ctx = getattr(exc, "ctx", None)
    command = next((a for a in argv if not a.startswith("-")), None)  # the subcommand, if any
    command = command if command in commands else None
    hint = f"`{PROGRAM} {command} --help` lists its options" if command else f"`{PROGRAM} --help` lists the commands"
    if _is(exc, "NoSuchOption"):
        from collocate.common.slurm_words import hint_for

        hint = hint_for(exc) or hint
    param = getattr(exc, "param", None)
    wanted = _wanted(ctx, param) if _is(exc, "BadParameter") and param is not None else None
    if wanted is None or param is None:  # param is set whenever wanted is; said for mypy
        return f"{exc.format_message()}\n  hint: {hint}"  # type: ignore[attr-defined]
    opts = list(getattr(param, "opts", None) or [])
    label = opts[0] if opts and opts[0].startswith("-") else (param.name or "argument").upper()
    if _is(exc, "MissingParameter"):  # not given at all: say so, not that its value is wrong
        return f"{label} is missing: give {wanted}\n  hint: {hint}"
    value = _given(opts, argv) if opts and opts[0].startswith("-") else None
    given = "" if value is None else f", not {value!r}"
    return f"{label} takes {wanted}{given}\n  hint: {hint}"


def _wanted(ctx: Any, param: Any) -> str | None:
    """What the parameter's annotation asks for, in words; None when it cannot be found."""
    callback = getattr(getattr(ctx, "command", None), "callback", None)
    if callback is None or not getattr(param, "name", None):
        return None
    try:
        hints = typing.get_type_hints(inspect.unwrap(callback))
    except Exception:  # an annotation that does not resolve: keep the library's message
        return None
    return _describe(hints.get(param.name))


def _describe(kind: Any) -> str | None:
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        return _describe(rest[0]) if len(rest) == 1 else None
    if origin in (list, tuple, set) and args:
        return _describe(args[0])
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return "one of " + ", ".join(str(m.value) for m in kind)
    return {int: "a whole number", float: "a number", bool: "true or false", Path: "a path"}.get(kind)


def _given(opts: list[str], argv: Sequence[str]) -> str | None:
    """The value written after the option (``--opt VALUE`` or ``--opt=VALUE``), last one wins."""
    found = None
    for i, token in enumerate(argv):
        if token == "--":
            break
        for opt in opts:
            if token == opt and i + 1 < len(argv):
                found = argv[i + 1]
            elif token.startswith(opt + "=") and opt.startswith("--"):
                found = token[len(opt) + 1:]
    return found
