"""Expand `collocate submit --sweep NAME=VALUES ... -- CMD {NAME}` into one job per grid point.

A sweep is the commonest reason to queue many jobs at once, and the shell loop users write for
it today is what collocate replaces. Only the placeholders of declared axes are replaced, so any
other braces in a command (JSON arguments, shell ``${VAR}``) pass through untouched. The same
placeholders are filled in ``--name``, in ``--env`` values and in ``--output``/``--error``
(where ``%a``, Slurm's array index, is the value of a sweep's only axis: ``wire/outputs.py``
fills the rest).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass

from collocate.common.errors import InputError
from collocate.wire.outputs import PERCENT as _PERCENT
from collocate.wire.outputs import escape

MAX_JOBS = 10_000  # a typo like seed=0..1000000 should not flood the queue
_RANGE = re.compile(r"^(-?\d+)\.\.(-?\d+)$")


@dataclass(frozen=True, slots=True)
class Axis:
    name: str
    values: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Point:
    """One job of a sweep: its values and its command with the placeholders filled in."""

    values: tuple[tuple[str, str], ...]
    command: tuple[str, ...]

    def label(self) -> str:
        return ",".join(f"{name}={value}" for name, value in self.values)

    def name(self, base: str) -> str:
        """The job's name: ``base`` with the placeholders filled, or ``base[lr=0.1,seed=0]``
        when it has none (so the jobs of a sweep tell apart in ``ls``)."""
        filled = _fill(base, self.values)
        return filled if filled != base else f"{base}[{self.label()}]"

    def fill(self, text: str) -> str:
        """``text`` (an ``--env NAME=VALUE``) with this job's placeholders filled: Slurm's
        ``$SLURM_ARRAY_TASK_ID`` as ``--env TASK={i}``."""
        return _fill(text, self.values)

    def path(self, template: str | None) -> str | None:
        """An ``--output``/``--error`` pattern for this job: placeholders filled, ``%a`` the
        value of the sweep's only axis; a value's ``%`` stays a ``%`` (``%%`` to the daemon)."""
        if template is None:
            return None
        text = _fill(template, tuple((n, escape(v)) for n, v in self.values))
        if len(self.values) != 1:
            return text  # ``%a`` is refused by the daemon, saying why
        return _PERCENT.sub(lambda m: escape(self.values[0][1]) if m[1] == "a" else m[0], text)


def parse_axis(text: str) -> Axis:
    """``lr=1e-3,3e-4`` (a list) or ``seed=0..4`` (integers, both ends included)."""
    name, sep, spec = text.partition("=")
    name = name.strip()
    if not sep or not name.isidentifier():
        raise InputError(
            f"cannot read --sweep {text!r}",
            hint="write NAME=V1,V2,... or NAME=FIRST..LAST, e.g. --sweep lr=1e-3,3e-4 --sweep seed=0..4",
        )
    if m := _RANGE.match(spec.strip()):
        first, last = int(m[1]), int(m[2])
        if last < first:
            raise InputError(f"--sweep {text!r}: the range is empty", hint=f"write {name}={last}..{first}?")
        if last - first >= MAX_JOBS:
            raise InputError(f"--sweep {text!r} asks for {last - first + 1} values", hint=f"at most {MAX_JOBS}")
        values = tuple(str(v) for v in range(first, last + 1))
    elif ".." in spec:
        raise InputError(f"--sweep {text!r}: a range takes whole numbers", hint=f"list the values: {name}=0.1,0.2,0.5")
    else:
        values = tuple(v.strip() for v in spec.split(","))
        if not spec.strip() or any(not v for v in values):
            raise InputError(f"--sweep {text!r} has an empty value", hint="separate values with commas: lr=1e-3,3e-4")
    return Axis(name, values)


def expand(command: Sequence[str], axes: Sequence[Axis], elsewhere: Sequence[str | None] = ()) -> list[Point]:
    """Every combination of the axes' values (the first axis varies slowest). Each axis must be
    used in the command or ``elsewhere`` (the ``--name``, ``--output``, ``--error``, ``--env``
    given)."""
    names = [a.name for a in axes]
    if len(set(names)) != len(names):
        raise InputError("--sweep names an axis twice", hint="give each NAME once, with all its values")
    texts = [*command, *(t for t in elsewhere if t)]
    unused = [n for n in names if not any("{" + n + "}" in text for text in texts)]
    if unused:
        raise InputError(
            f"--sweep {unused[0]} is not used in the command",
            hint=f"write {{{unused[0]}}} where its value goes, e.g. -- python train.py --{unused[0]} {{{unused[0]}}} "
                 "(or in --name, --output, --error, --env)",
        )
    count = 1
    for axis in axes:
        count *= len(axis.values)
    if count > MAX_JOBS:
        raise InputError(f"the sweep has {count} jobs", hint=f"at most {MAX_JOBS} per submit")
    points = []
    for combo in itertools.product(*(a.values for a in axes)):
        values = tuple(zip(names, combo, strict=True))
        points.append(Point(values, tuple(_fill(arg, values) for arg in command)))
    return points


def _fill(arg: str, values: tuple[tuple[str, str], ...]) -> str:
    for name, value in values:
        arg = arg.replace("{" + name + "}", value)
    return arg
