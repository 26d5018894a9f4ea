"""Placement policies: pure functions of (queue, cluster snapshot) that return a plan.

``make_policy(name, **params)`` is the one way to get a policy; ``POLICY_NAMES`` lists them.
Every policy is a frozen dataclass whose fields are its documented, named thresholds.
"""

from __future__ import annotations

from dataclasses import fields

from collocate.errors import InputError, UnknownNameError
from collocate.policies.auto import Auto
from collocate.policies.base import Policy
from collocate.policies.carma import Carma, CarmaOrder
from collocate.policies.declared import DeclaredMemory
from collocate.policies.exclusive import Exclusive
from collocate.policies.round_robin import RoundRobin
from collocate.policies.shares import Shares

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
    cls, fixed = _lookup(name)
    return [f.name for f in fields(cls) if f.name not in fixed]


def make_policy(name: str, **params: object) -> Policy:
    cls, fixed = _lookup(name)
    unknown = set(params) - set(policy_parameters(name))
    if unknown:
        raise InputError(
            f"policy {name!r} has no parameter {', '.join(sorted(unknown))}",
            hint=f"its parameters are: {', '.join(policy_parameters(name)) or 'none'}",
        )
    return cls(**fixed, **params)


def _lookup(name: str) -> tuple[type, dict[str, object]]:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownNameError("policy", name, POLICY_NAMES) from None


__all__ = ["POLICY_NAMES", "Policy", "make_policy", "parse_params", "policy_parameters"]


def parse_params(items: list[str]) -> dict[str, object]:
    """``["settle_s=5", ...]`` → ``{"settle_s": 5.0}`` (numbers become floats or ints)."""
    out: dict[str, object] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InputError(f"cannot read --param {item!r}", hint="write --param NAME=VALUE, e.g. settle_s=5")
        try:
            out[key] = int(value)
        except ValueError:
            try:
                out[key] = float(value)
            except ValueError:
                out[key] = value
    return out
