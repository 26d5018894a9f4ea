"""Memory sizes as people write them, turned into MiB (the unit the scheduler counts in).

Used wherever a size crosses the edge: ``collocate submit --mem``, ``collocate emulate-job
--mem``, trace files. Binary and decimal suffixes both mean powers of 1024, because that is what
``nvidia-smi`` and PyTorch print ("3G" next to a GPU means GiB to everyone who types it).
"""

from __future__ import annotations

import math
import re

from collocate.errors import InputError

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
    return InputError(
        f"cannot read memory size {text!r}",
        hint="write a number with an optional unit, e.g. 3GiB, 512MiB, 1.5G or 2048 (MiB)",
    )
