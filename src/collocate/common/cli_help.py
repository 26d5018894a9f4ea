"""A command's help as Typer's Rich layout should get it: paragraphs that reflow.

Why: Typer keeps the line breaks of a docstring after its first paragraph, so text wrapped at
100 columns in the source breaks mid-sentence in an 80-column terminal (issue 37). A command's
``register`` passes ``help=help_text(fn)``: each paragraph's lines joined into one that Rich
wraps to the terminal, except example command lines (``collocate ...``), which keep their own
line. ``tests/test_cli_help.py`` checks every command's help.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any


def help_text(fn: Callable[..., Any]) -> str:
    """``fn``'s docstring with each paragraph's lines joined, example commands kept apart."""
    return reflow(inspect.cleandoc(fn.__doc__ or ""))


def reflow(text: str) -> str:
    paragraphs = []
    for paragraph in text.split("\n\n"):
        lines: list[str] = []
        for line in paragraph.splitlines():
            if lines and not _example(line) and not _example(lines[-1]):
                lines[-1] += " " + line.strip()
            else:
                lines.append(line.strip())
        paragraphs.append("\n".join(lines))
    return "\n\n".join(paragraphs)


def _example(line: str) -> bool:
    return line.lstrip().startswith("collocate ")
