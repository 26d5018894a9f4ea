"""Placement policies: pure functions of (queue, cluster snapshot) that return a plan.

``make_policy(name, **params)`` is the one way to get a policy; ``POLICY_NAMES`` lists them.
Every policy is a frozen dataclass whose fields are its documented, named thresholds.
"""

from __future__ import annotations

import math
from dataclasses import MISSING, fields, is_dataclass, replace
from typing import get_type_hints

from collocate.common.errors import InputError, UnknownNameError
from collocate.core.policies.auto import Auto
from collocate.core.policies.base import Policy
from collocate.core.policies.carma import Carma, CarmaOrder
from collocate.core.policies.declared import DeclaredMemory
from collocate.core.policies.exclusive import Exclusive
from collocate.core.policies.round_robin import RoundRobin
from collocate.core.policies.shares import Shares

# name -> (class, fixed arguments); the remaining fields are the policy's tunable thresholds.
_REGISTRY: dict[str, tuple[type, dict[str, object]]] = {
    "exclusive": (Exclusive, {}),
    "shares": (Shares, {}),
    "declared-memory": (DeclaredMemory, {}),
    "round-robin": (RoundRobin, {}),
    **{f"carma-{o.value}": (Carma, {"order": o}) for o in CarmaOrder},
    "auto": (Auto, {}),
}

POLICY_NAMES: tuple[str, ...] = tuple(_REGISTRY)


def policy_parameters(name: str) -> list[str]:
    """The tunable thresholds of a policy, as ``--param`` names them: its numeric fields, and
    those of nested threshold groups as ``group.field`` (e.g. ``limits.sm``)."""
    return list(_parameter_types(name))


def make_policy(name: str, **params: object) -> Policy:
    """Build a policy, every parameter checked against its field's type and a sane range, so
    that a bad value is refused here (``serve`` and ``simulate`` fail at start) rather than
    raising in every scheduling round."""
    cls, fixed = _lookup(name)
    types = _parameter_types(name)
    unknown = set(params) - set(types)
    if unknown:
        raise InputError(
            f"policy {name!r} has no parameter {', '.join(sorted(unknown))}",
            hint=f"its parameters are: {', '.join(types) or 'none'}",
        )
    values: dict[str, object] = {}
    groups: dict[str, dict[str, object]] = {}
    for key, raw in params.items():
        value = _checked(name, key, raw, types[key], ", ".join(types))
        group, dot, member = key.partition(".")
        if dot:
            groups.setdefault(group, {})[member] = value
        else:
            values[key] = value
    for group, members in groups.items():
        default = next(f for f in fields(cls) if f.name == group)
        base = default.default_factory() if default.default is MISSING else default.default  # type: ignore[misc]
        values[group] = replace(base, **members)
    return cls(**fixed, **values)


def _parameter_types(name: str) -> dict[str, type]:
    cls, fixed = _lookup(name)
    out: dict[str, type] = {}
    hints = get_type_hints(cls)
    for f in fields(cls):
        kind = hints[f.name]
        if f.name in fixed or f.name in _MODELS:
            continue
        if kind in (int, float, bool):
            out[f.name] = kind
        elif is_dataclass(kind):  # a group of thresholds, e.g. RiskLimits
            inner = get_type_hints(kind)
            out.update({f"{f.name}.{g.name}": inner[g.name] for g in fields(kind) if inner[g.name] in (int, float, bool)})
    return out


_MODELS = frozenset({"interference"})  # a fitted model, not a threshold: no --param for it
# Parameters whose values are fractions (in [0, 1]); ``limits.*`` are utilization fractions too.
_FRACTIONS = frozenset({"pack_tolerance", "observe_below_sm"})
_AT_LEAST_ONE = frozenset({"max_slowdown", "startup_max_slowdown"})  # slowdown factors: 1 means none
_COUNTS_FROM_ZERO = frozenset({"startup_slots", "observe_slots"})  # 0 turns the rule off


def _range(key: str, kind: type) -> tuple[float, float]:
    if key in _FRACTIONS or key.startswith("limits."):
        return 0.0, 1.0
    if key in _COUNTS_FROM_ZERO:
        return 0.0, math.inf
    if key in _AT_LEAST_ONE or kind is int:  # counts: backfill depth, slots per GPU
        return 1.0, math.inf
    return 0.0, math.inf  # times (_s), memory (_mib), margins, gains: never negative


def _checked(policy: str, key: str, raw: object, kind: type, valid: str) -> object:
    lo, hi = _range(key, kind)
    bounds = f"{lo:g} or more" if hi == math.inf else f"between {lo:g} and {hi:g}"
    expected = "true or false" if kind is bool else f"{'an integer' if kind is int else 'a number'} {bounds}"

    def bad() -> InputError:
        return InputError(
            f"policy {policy!r}: parameter {key} must be {expected}, got {raw!r}",
            hint=f"e.g. --param {key}=<value>; its parameters are: {valid}",
        )

    if kind is bool:
        if isinstance(raw, bool):
            return raw
        text = str(raw).strip().lower()
        if text in ("true", "1", "yes", "on"):
            return True
        if text in ("false", "0", "no", "off"):
            return False
        raise bad()
    if isinstance(raw, bool):
        raise bad()
    try:
        value = float(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise bad() from None
    if not math.isfinite(value) or not lo <= value <= hi or (kind is int and not value.is_integer()):
        raise bad()
    return int(value) if kind is int else value


def _lookup(name: str) -> tuple[type, dict[str, object]]:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownNameError("policy", name, POLICY_NAMES) from None


__all__ = ["POLICY_NAMES", "Policy", "make_policy", "parse_params", "policy_parameters"]


def parse_params(items: list[str]) -> dict[str, object]:
    """``["min_gain=0.2", ...]`` → ``{"min_gain": 0.2}`` (numbers become floats or ints)."""
    out: dict[str, object] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InputError(f"cannot read --param {item!r}", hint="write --param NAME=VALUE, e.g. min_gain=0.2")
        try:
            out[key] = int(value)
        except ValueError:
            try:
                out[key] = float(value)
            except ValueError:
                out[key] = value
    return out
