"""Tables and lines for the client, written without importing Rich when they fit.

Why: importing Rich's console and table costs more than the rest of ``collocate ls`` together
(issue 37: the client answers in 150 ms). Most output is short plain text in columns, which
needs no wrapping: this module writes exactly what Rich would write for it (the same columns,
padding, trailing spaces and, on a terminal, bold headers) and hands everything else to Rich:
a cell, line, title or caption that would have to wrap or be cut, a table wider than the
terminal, a character that may not be one column wide, another style, or an environment that
changes Rich's behaviour (``FORCE_COLOR`` and the like). ``tests/daemon/test_textout.py``
checks both ways give the same bytes.

The classes mirror the few Rich calls ``render`` makes (``Table``, ``Text``, ``Console``),
and each converts to its Rich twin (``__rich__``), so a Rich console prints them as before.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import Any

#: Environment variables under which Rich styles or sizes output differently than a plain
#: terminal or pipe: with any set, Rich writes.
RICH_ENVIRONMENT = ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "JUPYTER_COLUMNS",
                    "JUPYTER_LINES", "NO_COLOR")
#: How Rich writes the styles this module writes itself on a terminal.
ANSI = {"bold": ("\x1b[1m", "\x1b[0m"), "italic": ("\x1b[3m", "\x1b[0m"),
        "italic dim": ("\x1b[2;3m", "\x1b[0m")}


def _narrow(text: str) -> bool:
    """Whether every character of ``text`` is surely one column wide and no line break:
    printable ASCII or the ellipsis ``render`` cuts with (anything else goes to Rich)."""
    return text.replace("…", "").isascii() and text.isprintable()


class Text:
    """A line of text in pieces, each with a style (Rich's ``Text``, ``Text.assemble``)."""

    def __init__(self, text: str = "", style: str = "") -> None:
        self.parts: list[tuple[str, str]] = [(text, style)]

    @classmethod
    def assemble(cls, *parts: str | tuple[str, str]) -> Text:
        out = cls()
        out.parts = [(p, "") if isinstance(p, str) else p for p in parts]
        return out

    @property
    def plain(self) -> str:
        return "".join(text for text, _ in self.parts)

    def __rich__(self) -> Any:
        from rich.text import Text as RichText

        return RichText.assemble(*self.parts)


@dataclass
class Column:
    header: str
    no_wrap: bool = False
    overflow: str = "ellipsis"
    width: int | None = None
    min_width: int | None = None
    max_width: int | None = None


@dataclass
class Table:
    """A table without borders (Rich's ``Table(box=None, ...)``)."""

    box: None = None
    header_style: str = ""
    pad_edge: bool = True
    padding: tuple[int, ...] = (0, 1)
    title: str | None = None
    title_justify: str = "center"
    caption: str | None = None
    caption_justify: str = "center"
    show_header: bool = True
    columns: list[Column] = field(default_factory=list)
    rows: list[tuple[str | Text, ...]] = field(default_factory=list)
    #: A line of text under a row, across the columns (row index -> text): what a narrow
    #: column could only cut (``ls``'s reasons in 80 columns); see ``note_lines``.
    notes: dict[int, str] = field(default_factory=dict)
    note_indent: int = 0

    @classmethod
    def grid(cls, padding: tuple[int, ...] = (0, 0), pad_edge: bool = False) -> Table:
        """Columns without a header (Rich's ``Table.grid``)."""
        return cls(padding=padding, pad_edge=pad_edge, show_header=False)

    def add_column(self, header: str = "", **options: Any) -> None:
        self.columns.append(Column(header, **options))

    def add_row(self, *cells: str | Text, note: str = "") -> None:
        if note:
            self.notes[len(self.rows)] = note
        self.rows.append(cells)

    def __rich__(self) -> Any:
        from rich.table import Table as RichTable

        options: dict[str, Any] = dict(header_style=self.header_style, pad_edge=self.pad_edge,
                                       padding=self.padding, title=self.title, title_justify=self.title_justify,
                                       caption=self.caption, caption_justify=self.caption_justify,
                                       show_header=self.show_header)
        table = RichTable(box=None, **options)
        for c in self.columns:
            column: dict[str, Any] = dict(no_wrap=c.no_wrap, overflow=c.overflow, width=c.width,
                                          min_width=c.min_width, max_width=c.max_width)
            table.add_column(c.header, **column)
        for row in self.rows:
            table.add_row(*(cell.__rich__() if isinstance(cell, Text) else cell for cell in row))
        return _NotedTable(table, self) if self.notes else table

    def lines(self, width: int, styled: bool) -> list[str] | None:
        """The table's lines as Rich writes them in ``width`` columns, or None where Rich
        would wrap or cut something (then Rich writes it)."""
        top, right, bottom, left = (self.padding * 4)[:4] if len(self.padding) == 1 else (
            self.padding * 2 if len(self.padding) == 2 else self.padding)
        if top or bottom or not self.columns:
            return None
        last = len(self.columns) - 1
        pads = [(0 if i == 0 and not self.pad_edge else left, 0 if i == last and not self.pad_edge else right)
                for i in range(len(self.columns))]
        if any(len(row) > len(self.columns) or any(isinstance(c, Text) and any(s for _, s in c.parts)
                                                   for c in row) for row in self.rows):
            return None  # styled cells: Rich writes them
        rows = [tuple(_cell_text(c) for c in row) + ("",) * (len(self.columns) - len(row)) for row in self.rows]
        header = tuple(c.header for c in self.columns)
        widths = []
        for i, col in enumerate(self.columns):
            texts = [*([header[i]] if self.show_header else []), *(row[i] for row in rows)]
            if not all(_narrow(t) for t in texts):
                return None
            most = col.width if col.width is not None else max([0, *(len(t) for t in texts)])
            if col.width is None and col.min_width is not None:  # Rich: a set width wins
                most = max(most, col.min_width)
            if col.width is None and col.max_width is not None:
                most = min(most, col.max_width)
            if any(len(t) > most for t in texts):
                return None  # Rich would wrap or cut it
            widths.append(most + sum(pads[i]) or 1)
        table_width = sum(widths)
        if table_width > width:
            return None
        out = []
        if self.title is not None:
            title = _annotation(self.title, self.title_justify, table_width, styled, "italic")
            if title is None:
                return None
            out.append(title)
        if not all(_narrow(note) for note in self.notes.values()):
            return None
        for n, row in enumerate((header, *rows) if self.show_header else rows):
            style = self.header_style if n == 0 and styled and self.show_header else ""
            if style and style not in ANSI:
                return None
            pieces: list[str] = []
            for text, w, (lp, rp) in zip(row, widths, pads, strict=True):
                segments = [" " * lp, text.ljust(w - lp - rp), " " * rp]
                pieces.extend(_style(s, style) for s in segments if s)
            out.append("".join(pieces))
            i = n - 1 if self.show_header else n
            if i in self.notes:
                out += note_lines(self.notes[i], self.note_indent, width)
        if self.caption is not None:
            caption = _annotation(self.caption, self.caption_justify, table_width, styled, "italic dim")
            if caption is None:
                return None
            out.append(caption)
        return out


#: A note takes at most this many lines; the rest is cut with ``…`` (the caller has it whole).
NOTE_LINES = 3


def note_lines(text: str, indent: int, width: int) -> list[str]:
    """A row's note wrapped at words to ``width`` columns, each line indented by ``indent``
    (under the second column, where a row's words begin), at most ``NOTE_LINES`` lines."""
    import textwrap

    room = max(8, width - indent)
    lines = textwrap.wrap(text, room, break_on_hyphens=False) or [""]
    if len(lines) > NOTE_LINES:
        last = lines[NOTE_LINES - 1]
        lines = [*lines[: NOTE_LINES - 1], (last if len(last) < room else last[: room - 1]) + "…"]
    return [" " * indent + line for line in lines]


class _NotedTable:
    """Rich's twin of a ``Table`` with notes: Rich's table, one line a row (every column of a
    noted table is ``no_wrap``), with each note's lines after its row."""

    def __init__(self, table: Any, source: Table) -> None:
        self.table, self.source = table, source

    def __rich_console__(self, console: Any, options: Any) -> Any:
        from rich.segment import Segment

        head = 1 if self.source.show_header else 0
        for n, line in enumerate(console.render_lines(self.table, options, pad=False)):
            yield from line
            yield Segment.line()
            if n - head in self.source.notes:
                for text in note_lines(self.source.notes[n - head], self.source.note_indent, options.max_width):
                    yield Segment(text)
                    yield Segment.line()


def _cell_text(cell: str | Text) -> str:
    return cell.plain if isinstance(cell, Text) else cell


def _style(text: str, style: str) -> str:
    if not style:
        return text
    on, off = ANSI[style]
    return on + text + off


def _annotation(text: str, justify: str, width: int, styled: bool, style: str) -> str | None:
    """A title or caption on one line, padded to the table's width as Rich pads it."""
    if justify != "left" or len(text) > width or not _narrow(text):
        return None
    return _style(text.ljust(width), style if styled else "")


class Console:
    """Writes to stdout as a Rich ``Console(markup=False, emoji=False, highlight=False)``
    would; ``width`` None: the terminal's (``COLUMNS`` first), 80 when unknown."""

    def __init__(self, width: int | None = None, **rich_options: Any) -> None:
        self._width = width
        self._options = rich_options
        self._rich: Any = None

    @property
    def width(self) -> int:
        if self._width is not None:
            return self._width
        columns = os.environ.get("COLUMNS", "")
        if columns.isdigit():
            return int(columns)
        for fd in (0, 1, 2):
            try:
                return os.get_terminal_size(fd).columns or 80
            except (AttributeError, ValueError, OSError):
                continue
        return 80

    def rich(self) -> Any:
        """The Rich console this one stands for (imported on first need)."""
        if self._rich is None:
            from rich.console import Console as RichConsole

            self._rich = RichConsole(width=self._width, **self._options)
        return self._rich

    def print(self, thing: str | Text | Table = "", style: str = "") -> None:
        lines = None if style else self._plain(thing)
        if lines is None:
            self.rich().print(thing, style=style)
            return
        sys.stdout.write("".join(line + "\n" for line in lines))

    def _plain(self, thing: str | Text | Table) -> list[str] | None:
        if any(name in os.environ for name in RICH_ENVIRONMENT):
            return None
        styled = sys.stdout.isatty()
        if styled and os.environ.get("TERM", "").lower() in ("dumb", "unknown"):
            return None
        width = self.width
        if isinstance(thing, Table):
            return thing.lines(width, styled)
        parts = [(thing, "")] if isinstance(thing, str) else thing.parts
        text = "".join(t for t, _ in parts)
        if len(text) > width or not _narrow(text):
            return None
        if any(s and s not in ANSI for _, s in parts):
            return None
        return ["".join(_style(t, s if styled else "") for t, s in parts if t)]
