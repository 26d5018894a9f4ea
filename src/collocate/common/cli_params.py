"""Options and arguments declared without importing Typer.

Importing Typer (and the Click inside it) is most of what ``collocate ls`` would cost (about
100 ms of a 150 ms budget), so the client's hot commands declare their options with these
stand-ins: ``Annotated[int, Option("--gpus", help=...)]`` reads as Typer's declaration does, and
takes the same settings. Two readers share them: ``adopt`` turns them into Typer's when a Typer
app is built (``--help``, completion, any command line the fast path leaves alone), and
``cli_fast`` parses the hot commands' common command lines from them directly. One
declaration, two parsers; ``tests/test_cli_fast.py`` checks they agree.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Annotated, Any, get_args, get_origin

if TYPE_CHECKING:
    from collections.abc import Callable

    import typer


class Option:
    """``typer.Option(*names, **settings)``, built only when Typer is."""

    __slots__ = ("names", "settings")

    def __init__(self, *names: str, **settings: Any) -> None:
        self.names = names
        self.settings = settings


class Argument:
    """``typer.Argument(**settings)``, built only when Typer is."""

    __slots__ = ("settings",)

    def __init__(self, **settings: Any) -> None:
        self.settings = settings


def echo(message: str = "", *, err: bool = False) -> None:
    """A line to stdout (or stderr), flushed: what ``typer.echo`` writes for plain text."""
    out = sys.stderr if err else sys.stdout
    out.write(f"{message}\n")
    out.flush()


def adopt(app: typer.Typer) -> typer.Typer:
    """``app`` with every registered command's (and group's) light declarations turned into
    Typer's, so Typer reads them as if written with ``typer.Option``; returns ``app``."""
    for info in app.registered_commands:
        if info.callback is not None:
            info.callback = typer_callback(info.callback)
    for group in app.registered_groups:
        if group.typer_instance is not None:
            adopt(group.typer_instance)
    return app


def typer_callback(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` as Typer should see it: a wrapper whose signature carries ``typer.Option`` and
    ``typer.Argument`` where ``fn`` declares ``Option`` and ``Argument``; ``fn`` itself when it
    declares none."""
    import functools
    import inspect
    import typing

    import typer

    hints = typing.get_type_hints(fn, localns={"typer": typer}, include_extras=True)
    if not any(isinstance(m, Option | Argument) for h in hints.values() for m in _metadata(h)):
        return fn
    converted = {name: _typer_hint(h) for name, h in hints.items()}
    signature = inspect.signature(fn)
    params = [p.replace(annotation=converted.get(p.name, p.annotation)) for p in signature.parameters.values()]

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    del wrapper.__wrapped__  # Typer reads the signature below, not fn's
    wrapper.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
    wrapper.__annotations__ = converted
    return wrapper


def _metadata(hint: Any) -> tuple[Any, ...]:
    return get_args(hint)[1:] if get_origin(hint) is Annotated else ()


def _typer_hint(hint: Any) -> Any:
    import typer

    if get_origin(hint) is not Annotated:
        return hint
    base, *meta = get_args(hint)
    meta = [typer.Option(*m.names, **m.settings) if isinstance(m, Option)
            else typer.Argument(**m.settings) if isinstance(m, Argument) else m for m in meta]
    return Annotated[(base, *meta)]
