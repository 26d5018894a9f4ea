"""Memory sizes and durations as people write them, turned into MiB and seconds.

Sizes cross the edge at ``collocate submit --mem``, ``collocate emulate-job --mem`` and in trace
files. Binary and decimal suffixes both mean powers of 1024, because that is what ``nvidia-smi``
and PyTorch print ("3G" next to a GPU means GiB to everyone who types it). Durations (``submit
--time``) read as Slurm's ``--time`` does, so a Slurm user's habit carries over: a bare number
is minutes, ``MM:SS``, ``HH:MM:SS`` and ``D-HH[:MM[:SS]]``; ``90s``, ``30m``, ``2h``, ``1d``
too. ``format_duration`` prints them as ``squeue``'s TIME column does.
"""

from __future__ import annotations

import math
import re

from collocate.common.errors import InputError

_FACTORS_MIB = {
    "": 1.0,  # a bare number is MiB, as in `nvidia-smi` and CARMA's .rad files
    "b": 1.0 / (1024 * 1024),
    "k": 1.0 / 1024,
    "m": 1.0,
    "g": 1024.0,
    "t": 1024.0 * 1024.0,
}

_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*$")
_SUFFIX = re.compile(r"^(?:(b|bytes?)|([kmgt])(?:i?b?))$", re.IGNORECASE)


def parse_mib(text: str | float | int) -> float:
    """Return the size ``text`` names, in MiB.

    Accepts ``3GiB``, ``3G``, ``3gb``, ``512MiB``, ``512M``, ``1.5G``, ``2048`` (MiB),
    ``1048576B``; K/M/G/T with or without ``i`` and ``B`` are all powers of 1024.

    >>> parse_mib("1.5G"), parse_mib("512MiB"), parse_mib("2048")
    (1536.0, 512.0, 2048.0)
    """
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value, unit = float(text), ""
    else:
        match = _SIZE.match(str(text))
        if not match:
            raise _bad(text)
        value, unit = float(match[1]), match[2]
    if unit:
        suffix = _SUFFIX.match(unit)
        if not suffix:
            raise _bad(text)
        unit = "b" if suffix[1] else suffix[2].lower()
    if not math.isfinite(value) or value < 0:
        raise _bad(text)
    return value * _FACTORS_MIB[unit]


def require_unit(text: str, option: str) -> None:
    """Refuse a size without a unit where a person types it (``--mem 6``): 6 MiB is almost
    never what they meant. Files and the daemon's API keep reading a bare number as MiB."""
    match = _SIZE.match(text)
    if match and not match[2]:
        value = match[1]
        raise InputError(f"{option} {text.strip()} has no unit",
                         hint=f"write {value}GiB, or {value}MiB if you mean mebibytes (G, GB and GiB all mean GiB)")


def option_bytes(text: str | None, option: str) -> int | None:
    """A size option written with its unit (``64MiB``, ``1G``) in bytes; None when not given."""
    if text is None:
        return None
    require_unit(text, option)
    size = int(parse_mib(text) * 2**20)
    if size <= 0:
        raise InputError(f"{option} must be more than 0, got {text!r}")
    return size


def format_mib(mib: float) -> str:
    """Short human form of a MiB count: ``512 MiB``, ``3.50 GiB``."""
    if mib >= 1024:
        return f"{mib / 1024:.2f} GiB"
    return f"{mib:.0f} MiB"


def _bad(text: object) -> InputError:
    match = _SIZE.match(str(text))
    if match:  # a number and letters that are no unit: `3GiBs`, `3 gigs`
        value = match[1]
        hint = f"write {value}GiB or {value}MiB (K, M, G, T, with or without i and B)"
    else:
        hint = "write a number and a unit, e.g. 3GiB, 512MiB or 1.5G"
    return InputError(f"cannot read memory size {text!r}", hint=hint)


_DURATION_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")


def parse_duration(text: str | float | int, option: str = "--time") -> float:
    """Seconds in a time limit, Slurm-style: ``30`` (minutes), ``30:00`` (MM:SS),
    ``2:00:00``, ``1-12``, ``1-12:30``, ``1-12:30:00``; or ``90s``, ``30m``, ``2h``, ``1.5d``.

    >>> parse_duration("30"), parse_duration("1:30:00"), parse_duration("1-0"), parse_duration("90s")
    (1800.0, 5400.0, 86400.0, 90.0)
    """
    raw = str(text).strip().lower()
    seconds: float | None = None
    if raw and raw[-1] in _DURATION_UNITS:
        try:
            seconds = float(raw[:-1]) * _DURATION_UNITS[raw[-1]]
        except ValueError:
            seconds = None
    elif m := _DURATION.match(raw):
        days, a, b, c = (int(g) if g is not None else None for g in m.groups())
        if days is not None:  # D-HH, D-HH:MM, D-HH:MM:SS
            seconds = days * 86400.0 + (a or 0) * 3600.0 + (b or 0) * 60.0 + (c or 0)
        elif c is not None:  # HH:MM:SS
            seconds = (a or 0) * 3600.0 + (b or 0) * 60.0 + c
        elif b is not None:  # MM:SS
            seconds = (a or 0) * 60.0 + b
        else:  # a bare number: minutes, as Slurm reads it
            seconds = (a or 0) * 60.0
    if seconds is None or not math.isfinite(seconds) or seconds <= 0:
        raise InputError(f"cannot read {option} {str(text)!r} as a time limit",
                         hint="write minutes (30), MM:SS, HH:MM:SS, D-HH:MM:SS as Slurm does, "
                         "or 90s, 30m, 2h, 1d")
    return seconds


def format_duration(seconds: float | None) -> str:
    """``squeue``'s TIME: ``M:SS``, ``H:MM:SS``, ``D-HH:MM:SS``; ``-`` when unknown."""
    if seconds is None or not math.isfinite(seconds):
        return "-"
    total = max(0, int(seconds))
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}-{hours:02d}:{minutes:02d}:{secs:02d}"
    if hours:
        return f"{hours}:{minutes:02d}:{secs:02d}"
    return f"{minutes}:{secs:02d}"
