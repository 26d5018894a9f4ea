"""The fast path (``collocate.cli.fast``) reads command lines as Typer does, or not at all.

For each hot command, generated command lines go both ways: through ``cli_fast.parse`` and
through the Typer command ``collocate.cli.typer_app.load`` builds (its function swapped for a
recorder). Where the fast path reads a line, Typer must call the command's function with the
same arguments; where Typer refuses a line, the fast path must leave it to Typer. Lines built
only from the declared options must all be read fast (else the fast path would silently be
slow). The root ``--help`` must be Typer's text at every width.
"""

from __future__ import annotations

import functools
import io
import os
from contextlib import redirect_stdout
from pathlib import Path
from typing import Annotated, Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from collocate.cli import COMMANDS
from collocate.cli import fast as cli_fast
from collocate.common.cli_params import Argument, Option

HOT = sorted(cli_fast.HOT)
ENVVARS = ("COLLOCATE_HOST", "COLLOCATE_TOKEN_FILE", "COLLOCATE_FINGERPRINT")
_typer_commands: dict[str, tuple[Any, list[dict[str, Any]]]] = {}


def _typer(name: str) -> tuple[Any, list[dict[str, Any]]]:
    """The Typer command ``name`` with its function replaced by a recorder, and its records."""
    if name not in _typer_commands:
        from collocate.cli import typer_app as cli_app

        hot = cli_fast.HOT[name]
        module = __import__(hot.module, fromlist=["_"])
        original = getattr(module, hot.function)
        calls: list[dict[str, Any]] = []

        @functools.wraps(original)
        def record(**kwargs: Any) -> None:
            calls.append(kwargs)

        with mock.patch.object(module, hot.function, record):
            command = cli_app.load(name)
        _typer_commands[name] = (command, calls)
    return _typer_commands[name]


def _through_typer(name: str, argv: list[str]) -> dict[str, Any] | None:
    """The arguments Typer calls ``name``'s function with for ``argv``; None if it does not."""
    command, calls = _typer(name)
    calls.clear()
    try:
        with redirect_stdout(io.StringIO()):
            command.main(argv, prog_name=f"collocate {name}", standalone_mode=False)
    except Exception as exc:
        if not any(c.__name__ in ("UsageError", "BadParameter") for c in type(exc).__mro__):
            raise
        return None
    if not calls:
        return None
    call = dict(calls[0])
    call.pop("ctx", None)
    return call


def _through_fast(name: str, argv: list[str]) -> dict[str, Any] | None:
    found = cli_fast.parse(name, argv)
    if found is None:
        return None
    call = dict(found[1])
    call.pop("ctx", None)
    return call


def _declared(name: str) -> list[cli_fast._Param]:
    hot = cli_fast.HOT[name]
    params = cli_fast._params(getattr(__import__(hot.module, fromlist=["_"]), hot.function))
    assert params is not None, f"the fast path cannot read {name}'s declarations: every {name} goes to Typer"
    return params


def test_every_hot_command_is_a_command_and_its_declarations_read():
    for name, hot in cli_fast.HOT.items():
        assert COMMANDS[name].module == hot.module
        command, _ = _typer(name)
        interspersed = command.context_settings.get("allow_interspersed_args", command.allow_interspersed_args)
        assert interspersed == hot.interspersed, name
        fast = {n for p in _declared(name) if isinstance(p.decl, Option) for n in p.decl.names}
        typer = {n for p in command.params for n in p.opts if n.startswith("-")} - {"-h", "--help"}
        assert fast == typer, name


#: what a command line's word may hold: not NUL, which no argv can carry, nor a surrogate
#: (Python decodes argv's undecodable bytes to U+DC80..U+DCFF only, and ``os.stat`` takes those)
ARGV_TEXT = st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")
WORDS = st.sampled_from(["x", "a b", "", "-", "--", "-x", "--mem", "=", "7", "-3", " 5", "+4", "1_0",
                         "2.5", "1e3", "nan", "inf", "abc", "é", "~/d", "a=b", "6GiB", "/tmp"])


@st.composite
def _lines(draw: Any, name: str) -> tuple[list[str], dict[str, str]]:
    """A command line of ``name`` from its declared options, in every form Click accepts, and
    the environment it runs in."""
    params = _declared(name)
    options = [p for p in params if isinstance(p.decl, Option)]
    argv: list[str] = []
    for _ in range(draw(st.integers(0, 8))):
        param = draw(st.sampled_from(options))
        spelling = draw(st.sampled_from(param.decl.names))
        if param.convert is None:
            argv.append(spelling)
            continue
        if param.convert in (int, float):
            value = draw(st.one_of(st.integers(-10**6, 10**6).map(str), st.floats(-1e3, 1e3, allow_nan=False).map(str)
                                   if param.convert is float else st.nothing(), WORDS))
        else:
            value = draw(st.one_of(WORDS, st.text(ARGV_TEXT, max_size=6)))
        if spelling.startswith("--") and draw(st.booleans()):
            argv.append(f"{spelling}={value}")
        else:
            argv += [spelling, value]
    arguments = [p for p in params if isinstance(p.decl, cli_fast.Argument)]
    for param in arguments:
        words = draw(st.lists(st.one_of(WORDS, st.text(ARGV_TEXT, min_size=1, max_size=5)), min_size=0 if param.multiple else 1,
                              max_size=4 if param.multiple else 1))
        if param.multiple and draw(st.booleans()):
            words = ["--", *words]
        argv += words
    env = draw(st.dictionaries(st.sampled_from(ENVVARS), st.sampled_from(["", "h:1", "/tmp/t", "ab"]), max_size=2))
    return argv, env


def _same(name: str, argv: list[str], env: dict[str, str], *, must_read: bool) -> None:
    clean = {k: v for k, v in os.environ.items() if k not in ENVVARS}
    with mock.patch.dict(os.environ, {**clean, **env}, clear=True):
        fast = _through_fast(name, argv)
        typer = _through_typer(name, argv)
    if fast is not None:  # compared by repr: the types too (a Path is not a str), and nan is nan
        assert typer is not None and {k: repr(v) for k, v in typer.items()} == {k: repr(v) for k, v in fast.items()}, (
            argv, env, typer, fast)
    elif must_read and typer is not None:
        pytest.fail(f"collocate {name} {argv} ({env}) reads with Typer but not on the fast path")


@pytest.mark.parametrize("name", HOT)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_a_declared_command_line_reads_fast_and_as_typer_reads_it(name: str, data: Any):
    argv, env = data.draw(_lines(name))
    declines = cli_fast.HOT[name].declines
    call = _through_fast(name, argv)
    _same(name, argv, env, must_read=not (declines and call is None and _names_a_file(argv)))


def _names_a_file(argv: list[str]) -> bool:
    return any(os.path.isfile(w) for w in argv)


TOKENS = st.sampled_from(["--", "-", "-h", "--help", "-as", "-a", "-s", "running", "--all", "--all=1",
                          "--state", "--state=done", "--format", "json", "--gpus", "2", "--gpus=x",
                          "--hold", "--hold=1", "--mem", "1GiB", "-t", "5", "-t5", "--bogus", "1", "2",
                          "true", "--env", "A=1", "--watch", "-w", "--cwd", ".", "--host", "h:1", "x y"])


@pytest.mark.parametrize("name", HOT)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(argv=st.lists(TOKENS, max_size=8))
def test_any_command_line_is_read_as_typer_reads_it_or_left_to_typer(name: str, argv: list[str]):
    _same(name, argv, {}, must_read=False)


def test_unusual_lines_go_to_typer():
    assert cli_fast.parse("ls", ["-as", "running"]) is None  # together: Click splits them
    assert cli_fast.parse("ls", ["--help"]) is None
    assert cli_fast.parse("ls", ["--all=yes"]) is None
    assert cli_fast.parse("show", []) is None
    assert cli_fast.parse("show", ["1", "2"]) is None
    assert cli_fast.parse("submit", ["--gpus", "two", "--", "true"]) is None
    assert cli_fast.parse("submit", [str(Path(__file__))]) is None  # a job script, maybe
    found = cli_fast.parse("submit", ["--hold", "python", "x.py", "--gpus", "3"])  # its command's own
    assert found is not None and found[1]["command"] == ["python", "x.py", "--gpus", "3"]
    assert found[1]["gpus"] == 1 and found[1]["hold"] is True


def _needs_name(name: Annotated[str, Option("--name", "-n")], flag: Annotated[bool, Option("--flag")] = False) -> None:
    """A command with a required option."""


def _calls_back(n: Annotated[int, Option("--n", callback=print)] = 1) -> None:
    """A command whose option has a callback: Click runs it, so Typer must read the line."""


def _two_arguments(a: Annotated[str, Argument()], b: Annotated[str, Argument()]) -> None:
    """Two arguments: how Click shares words out among them is Typer's business."""


def _typer_declared(n: Annotated[int, typer.Option("--n")] = 1) -> None:  # noqa: F821 (no typer here)
    """Declared with Typer's own option, whose module the fast path does not import."""


def test_a_declaration_the_fast_path_does_not_know_sends_every_line_to_typer():
    assert cli_fast._params(_calls_back) is None
    assert cli_fast._params(_typer_declared) is None
    params = cli_fast._params(_needs_name)
    assert cli_fast._read(params, ["-n", "x", "--flag"], True) == {"name": "x", "flag": True}
    assert cli_fast._read(params, ["--flag"], True) is None  # missing: Typer says so
    assert cli_fast._read(cli_fast._params(_two_arguments), ["x", "y"], True) is None


def test_an_option_reads_its_environment_variable_unless_empty_or_given():
    with mock.patch.dict(os.environ, {"COLLOCATE_HOST": "h:1", "COLLOCATE_TOKEN_FILE": ""}):
        call = cli_fast.parse("ls", [])[1]
        assert call["host"] == "h:1" and call["token_file"] is None
        assert cli_fast.parse("ls", ["--host", "g:2"])[1]["host"] == "g:2"


def _typer_root_help() -> str:
    from collocate.cli.typer_app import app

    out = io.StringIO()
    with redirect_stdout(out):
        app(["--help"], prog_name="collocate", standalone_mode=False)
    return out.getvalue()


@pytest.mark.parametrize("columns", [20, 50, 52, 60, 64, 72, 79, 80, 81, 100, 200])
def test_root_help_is_typers_at_every_width(columns: int, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("COLUMNS", str(columns))
    assert cli_fast.root_help(cli_fast.help_width()) == _typer_root_help()


HELP_TEXT = st.text(st.sampled_from("abc xyz-.,`()\n"), max_size=160).filter(lambda t: "\n\n\n" not in t)


@settings(max_examples=60, deadline=None)
@given(rows=st.dictionaries(st.from_regex(r"[a-z][a-z-]{0,39}", fullmatch=True), HELP_TEXT, min_size=1, max_size=6),
       columns=st.integers(40, 110))
def test_root_help_is_typers_for_any_table_of_commands(rows: dict[str, str], columns: int):
    table = {name: COMMANDS["ls"]._replace(help=text) for name, text in rows.items()}
    with mock.patch.dict(COMMANDS, table, clear=True), mock.patch.dict(os.environ, {"COLUMNS": str(columns)}):
        assert cli_fast.root_help(cli_fast.help_width()) == _typer_root_help()


@pytest.mark.parametrize("args", [["--help"], ["-h"], ["--version"], ["-V"]])
def test_root_help_and_version_answer_without_typer(args: list[str]):
    """As members run it: a fresh process, which must not import Typer (nor Click)."""
    import subprocess
    import sys

    probe = ("import sys, atexit\n"
             "atexit.register(lambda: sys.stderr.write(repr(sorted(m for m in sys.modules if 'typer' in m "
             "or 'click' in m))))\n"
             "sys.argv[0] = 'collocate'\n"
             "from collocate.cli import main\n"
             "main()\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("_COLLOCATE", "_TYPER"))}
    done = subprocess.run([sys.executable, "-c", probe, *args], capture_output=True, text=True, timeout=60,
                          env=env, check=False)
    assert done.returncode == 0 and done.stderr == "[]", done.stderr
    assert ("Commands:" in done.stdout) == (args[0] in ("--help", "-h"))
