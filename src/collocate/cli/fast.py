"""The client's fast path: what members type most, answered without importing Typer.

Importing Typer and its Click is about 100 ms of CPU, two thirds of the 150 ms a command may
take (issue 37). So ``collocate --help``/``-h``, ``--version``/``-V`` and the common command
lines of ``submit``, ``ls``, ``show`` and ``gpus`` (and ``logs``, ``cancel``, ``wait``) are read here, from the very declarations Typer
reads (``cli_params.Option`` and ``Argument`` on the command's function), with Click's grammar:
``--opt VALUE``, ``--opt=VALUE``, ``-o VALUE``, flags, repeated options (the last wins, or each
adds to a list), the options' environment variables, ``--`` and, where the command allows it,
arguments among the options. The command's own function then runs, under the error handling
Typer's path uses (``cli_errors.reported``).

Anything else goes to Typer untouched, so the two can only differ in speed: a mistake (an
unknown option, a value that does not convert, a missing or extra argument), a command's
``-h``, short options written together (``-as``), shell completion, and ``submit`` of a job
script (its ``#COLLOCATE`` lines are read by Click's parser). ``tests/test_cli_fast.py`` holds
both paths to the same calls and the root help to the same text.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from types import UnionType
from typing import Annotated, Any, NamedTuple, Union, get_args, get_origin

from collocate.cli import COMMANDS, ROOT_HELP, VERSION_HELP
from collocate.common.cli_params import Argument, Option

PROGRAM = "collocate"
#: Set by the shell when it asks Typer for completions (``_COLLOCATE_COMPLETE``), or by Typer's
#: own tests of it (``_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION``): Typer answers those.
_TYPER_ENV = ("_COLLOCATE_COMPLETE", "_TYPER_")
#: Settings of an option that change nothing of how a command line reads.
_INERT = frozenset({"help", "metavar", "show_default", "show_envvar", "readable", "rich_help_panel"})


class Hot(NamedTuple):
    """A command the fast path reads: its function, and whether options may follow arguments
    (``submit`` stops at its command: ``submit python x.py --lr 3`` is not ``--lr`` of submit)."""

    module: str
    function: str
    interspersed: bool = True
    #: command lines (the parsed call) left to Typer although they read: None, or a predicate
    declines: Callable[[dict[str, Any]], bool] | None = None


def _names_a_file(call: dict[str, Any]) -> bool:
    """``submit train.sh``: maybe a job script, whose ``#COLLOCATE`` lines Click's parser reads."""
    command = call.get("command")
    return isinstance(command, list) and bool(command) and os.path.isfile(command[0])


HOT: dict[str, Hot] = {
    "submit": Hot("collocate.client.cli", "submit", interspersed=False, declines=_names_a_file),
    "ls": Hot("collocate.client.cli", "ls"),
    "show": Hot("collocate.client.cli", "show"),
    "gpus": Hot("collocate.client.cli", "gpus"),
    "logs": Hot("collocate.client.cli", "logs"),
    "cancel": Hot("collocate.client.cli", "cancel"),
    "wait": Hot("collocate.client.cli", "wait"),
}


def answer(argv: list[str]) -> None:
    """Answer ``argv`` and exit, when the fast path knows it; return when Typer should."""
    if any(k.startswith(_TYPER_ENV) for k in os.environ):
        return
    if argv in (["--help"], ["-h"]):
        sys.stdout.write(root_help(help_width()))
        sys.exit(0)
    if argv in (["--version"], ["-V"]):
        from collocate import __version__

        sys.stdout.write(f"{PROGRAM} {__version__}\n")
        sys.exit(0)
    if not argv or argv[0] not in HOT:
        return
    call = parse(argv[0], argv[1:])
    if call is None:
        return
    from collocate.common.cli_errors import reported

    function, kwargs = call
    with reported(argv, set(COMMANDS)):
        function(**kwargs)
    sys.exit(0)


# -- command lines -------------------------------------------------------------------------


class _Param(NamedTuple):
    name: str
    decl: Option | Argument | None  # None: the click context (``ctx: typer.Context``), passed as None
    convert: Callable[[str], Any] | None  # None: a flag
    multiple: bool  # an option given many times, or an argument taking all that is left
    default: Any
    required: bool


def parse(command: str, args: list[str]) -> tuple[Callable[..., Any], dict[str, Any]] | None:
    """The function of hot ``command`` and its keyword arguments for ``args``, as Typer would
    call it; None where the fast path leaves ``args`` to Typer."""
    import importlib

    hot = HOT[command]
    function = getattr(importlib.import_module(hot.module), hot.function)
    params = _params(function)
    if params is None:
        return None
    call = _read(params, args, hot.interspersed)
    if call is None or (hot.declines is not None and hot.declines(call)):
        return None
    return function, call


def _params(function: Callable[..., Any]) -> list[_Param] | None:
    """``function``'s parameters as declared (a ``typer.Context`` one as None), or None if one is
    declared in a way this reader does not know."""
    code = function.__code__
    names = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
    defaults = dict(zip(names[code.co_argcount - len(function.__defaults__ or ()):code.co_argcount],
                        function.__defaults__ or (), strict=True))
    defaults.update(function.__kwdefaults__ or {})
    out = []
    for name in names:
        annotation = function.__annotations__.get(name)
        if annotation == "typer.Context":
            out.append(_Param(name, None, None, False, None, False))
            continue
        try:  # a name the module imports only for type checkers (``typer.Option``): Typer's to read
            hint = eval(annotation, function.__globals__) if isinstance(annotation, str) else annotation  # noqa: S307
        except NameError:
            return None
        if get_origin(hint) is not Annotated:
            return None
        base, *meta = get_args(hint)
        decls = [m for m in meta if isinstance(m, Option | Argument)]
        if len(decls) != 1 or set(decls[0].settings) - _INERT - ({"envvar"} if isinstance(decls[0], Option) else set()):
            return None
        kind = _kind(base)
        if kind is None:
            return None
        convert, multiple = kind
        if convert is None and (isinstance(decls[0], Argument) or multiple or defaults.get(name) is not False
                                or any("/" in n for n in decls[0].names)):
            return None  # a flag is read here only as Click reads --flag alone: True when given
        if (multiple or not isinstance(decls[0].settings.get("envvar", ""), str)) and "envvar" in decls[0].settings:
            return None  # Click splits a list's variable, and reads several variables in turn: Typer's
        out.append(_Param(name, decls[0], convert, multiple, defaults.get(name), name not in defaults))
    return out


def _kind(base: Any) -> tuple[Callable[[str], Any] | None, bool] | None:
    """(how a word converts, None for a flag; one value or many) for a parameter's type, or
    None for a type this reader does not know."""
    if get_origin(base) in (Union, UnionType):  # X | None
        rest = [a for a in get_args(base) if a is not type(None)]
        if len(rest) != 1:
            return None
        base = rest[0]
    multiple = get_origin(base) is list
    if multiple:
        if len(get_args(base)) != 1:
            return None
        base = get_args(base)[0]
    elif get_origin(base) is not None:
        return None
    if base is bool:
        return None, multiple
    from pathlib import Path

    convert = {int: int, float: float, str: str, Path: Path}.get(base)
    return None if convert is None else (convert, multiple)


def _read(params: list[_Param], args: list[str], interspersed: bool) -> dict[str, Any] | None:
    """Click's grammar over ``args``: the keyword arguments, or None at anything unusual."""
    options = {n: p for p in params if isinstance(p.decl, Option) for n in p.decl.names}
    arguments = [p for p in params if isinstance(p.decl, Argument)]
    given: dict[str, Any] = {}
    rest = list(args)
    positional: list[str] = []
    while rest:
        word = rest.pop(0)
        if word == "--":
            break
        if word[:1] != "-" or len(word) == 1:
            if interspersed:
                positional.append(word)
                continue
            rest.insert(0, word)
            break
        name, equals, value = word.partition("=") if word.startswith("--") else (word, "", "")
        param = options.get(name)
        if param is None:
            return None
        if param.convert is None:  # a flag
            if equals:
                return None
            given[param.name] = True
            continue
        if not equals:
            if not rest:
                return None
            value = rest.pop(0)
        if param.multiple:
            given.setdefault(param.name, []).append(value)
        else:
            given[param.name] = value  # the last one given wins, and only it is converted
    positional += rest
    try:
        for param in params:
            if param.name in given and param.convert is not None:
                words = given[param.name]
                given[param.name] = [param.convert(w) for w in words] if param.multiple else param.convert(words)
    except ValueError:
        return None
    call: dict[str, Any] = {}
    for param in params:
        if param.decl is None:  # the click context
            call[param.name] = None
        elif isinstance(param.decl, Option):
            if param.required and param.name not in given:
                return None  # Typer says it is missing
            call[param.name] = given[param.name] if param.name in given else _unset(param)
    if len(arguments) > 1:
        return None
    for param in arguments:
        if param.multiple:
            words, positional = positional, []
            if not words and param.required:
                return None
            try:
                call[param.name] = [param.convert(w) for w in words] if words else param.default  # type: ignore[misc]
            except ValueError:
                return None
        elif positional:
            try:
                call[param.name] = param.convert(positional.pop(0))  # type: ignore[misc]
            except ValueError:
                return None
        elif param.required:
            return None
        else:
            call[param.name] = param.default
    if positional or any(p.required and p.name not in call for p in params) or _ENV_FAILED in call.values():
        return None
    return call


_ENV_FAILED = object()  # an environment variable's value that does not convert: Typer says why


def _unset(param: _Param) -> Any:
    """An option not on the command line: its environment variable's value, else its default."""
    envvar = param.decl.settings.get("envvar") if param.decl is not None else None
    value = os.environ.get(envvar) if envvar else None
    if not value:
        return list(param.default) if param.multiple else param.default
    try:
        return param.convert(value)  # type: ignore[misc]
    except ValueError:
        return _ENV_FAILED


# -- the root's --help ---------------------------------------------------------------------

#: The root's options, as Click lists them (--install-completion and --show-completion are
#: Typer's; -h/--help is Click's).
ROOT_OPTIONS = (
    ("-V, --version", VERSION_HELP),
    ("--install-completion", "Install completion for the current shell."),
    ("--show-completion", "Show completion for the current shell, to copy it or customize the installation."),
    ("-h, --help", "Show this message and exit."),
)


def help_width() -> int:
    """The width Click lays help out in: the terminal's, within 50 to 78 columns. The
    terminal's as ``shutil.get_terminal_size`` finds it ($COLUMNS, else stdout's, else 80),
    without importing shutil (and the compression modules it brings)."""
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns or 80  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            columns = 80
    return max(min(columns, 80) - 2, 50)


def root_help(width: int) -> str:
    """``collocate --help`` as Click writes it in ``width`` columns (the plain layout the root
    group uses: ``cli_app.LazyGroup``), from ``COMMANDS``, ``ROOT_HELP`` and ``ROOT_OPTIONS``."""
    commands = [(name, c.help) for name, c in COMMANDS.items() if not c.hidden]
    parts = [f"Usage: {PROGRAM} [OPTIONS] COMMAND [ARGS]...\n",
             "\n" + _wrap(ROOT_HELP, width, "  ") + "\n",
             "\nOptions:\n" + _definitions(ROOT_OPTIONS, width, 2),
             "\nCommands:\n" + _definitions(commands, width, 2)]
    return "".join(parts).rstrip("\n") + "\n"


def _definitions(rows: list[tuple[str, str]] | tuple[tuple[str, str], ...], width: int, indent: int) -> str:
    """Click's ``HelpFormatter.write_dl``: names in a column of at most 30, their text wrapped."""
    first_col = min(max(len(name) for name, _ in rows), 30) + 2
    out = []
    for name, text in rows:
        out.append(" " * indent + name)
        if not text:
            out.append("\n")
            continue
        if len(name) <= first_col - 2:
            out.append(" " * (first_col - len(name)))
        else:
            out.append("\n" + " " * (first_col + indent))
        lines = _wrap(text, max(width - first_col - 2, 10), "").splitlines()
        if not lines:
            out.append("\n")
            continue
        out.append(lines[0] + "\n")
        out.extend(" " * (first_col + indent) + line + "\n" for line in lines[1:])
    return "".join(out)


def _wrap(text: str, width: int, indent: str) -> str:
    """Click's ``wrap_text(..., preserve_paragraphs=True)``: paragraphs apart by blank lines,
    each wrapped at its own indent; one whose first line is ``\\b`` kept as written."""
    import textwrap

    class Wrapper(textwrap.TextWrapper):
        def _handle_long_word(self, reversed_chunks: list[str], cur_line: list[str], cur_len: int,
                              width: int) -> None:  # Click's: cut at the margin, hyphens or not
            space_left = max(width - cur_len, 1)
            cur_line.append(reversed_chunks[-1][:space_left])
            reversed_chunks[-1] = reversed_chunks[-1][space_left:]

    paragraphs: list[tuple[int, bool, str]] = []
    lines: list[str] = []
    first_indent: int | None = None

    def flush() -> None:
        if lines:
            raw = lines[0].strip() == "\b"
            paragraphs.append((first_indent or 0, raw, "\n".join(lines[1:]) if raw else " ".join(lines)))
            lines.clear()

    for line in text.expandtabs().splitlines():
        if not line:
            flush()
            first_indent = None
            continue
        if first_indent is None:
            stripped = line.lstrip()
            first_indent, line = len(line) - len(stripped), stripped
        lines.append(line)
    flush()
    out = []
    for extra, raw, paragraph in paragraphs:
        lead = indent + " " * extra
        if raw:
            out.append("\n".join(lead + line for line in paragraph.splitlines()))
        else:
            out.append(Wrapper(width, initial_indent=lead, subsequent_indent=lead,
                               replace_whitespace=False).fill(paragraph))
    return "\n\n".join(out)
