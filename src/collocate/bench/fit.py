"""Least-squares fits of the interference and power models (numpy only).

Interference (``collocate.interference.shared_slowdown``), per sharing mode::

    slowdown = (1 + base + per_sm * S_o + per_dram * D_o) * max(1, A, D) ** e

For a fixed exponent ``e`` this is *linear* in (base, per_sm, per_dram): with
``g = max(1, A, D) ** e`` the residual is ``slowdown - g - g*base - g*S_o*per_sm - g*D_o*per_dram``.
So the fit is variable projection: a 1-D search over ``e`` (grid, then golden-section refinement)
with an exact linear least-squares solve inside, in slowdown units (the error we report).
``per_sm`` and ``per_dram`` are kept >= 0 by solving every active set of the two (an exact
non-negative solve for two variables); ``base`` is free. When no observation over-subscribes the
GPU (all ``max(1, A, D) == 1``) the exponent cannot be identified and keeps its prior.

Power: ``watts = idle + (max - idle) * busy ** e``, linear in (idle, max - idle) for fixed ``e``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from collocate.interference import ModeParams, shared_slowdown

EXPONENT_RANGE = (0.0, 3.0)
POWER_EXPONENT_RANGE = (0.2, 3.0)


@dataclass(frozen=True, slots=True)
class Observation:
    """One job in one collocated scenario: its solo profile, its co-runners', its slowdown."""

    sm: float
    dram: float
    other_sm: float
    other_dram: float
    slowdown: float
    group: str  # the mix it belongs to (held-out splits keep a mix together)


@dataclass(frozen=True, slots=True)
class ModeFit:
    params: ModeParams
    n: int
    rmse: float
    exponent_identified: bool


@dataclass(frozen=True, slots=True)
class PowerFit:
    idle_watts: float
    max_watts: float
    exponent: float
    n: int
    rmse: float
    exponent_identified: bool


def _arrays(obs: Sequence[Observation]) -> tuple[np.ndarray, ...]:
    a = np.array([[o.sm, o.dram, o.other_sm, o.other_dram, o.slowdown] for o in obs], dtype=float)
    return a[:, 0], a[:, 1], a[:, 2], a[:, 3], a[:, 4]


def predict(params: ModeParams, obs: Sequence[Observation]) -> np.ndarray:
    """The model's slowdowns for these observations (the code the simulator runs)."""
    sm, dram, osm, odram, _ = _arrays(obs)
    return np.asarray(shared_slowdown(params, sm, dram, osm, odram), dtype=float)


def _solve_linear(g: np.ndarray, osm: np.ndarray, odram: np.ndarray,
                  y: np.ndarray) -> tuple[np.ndarray, float]:
    """min ||y - g*(1 + b + s*osm + d*odram)|| with s, d >= 0: coefficients (b, s, d), SSE."""
    target = y - g
    columns = [g * osm, g * odram]
    best: tuple[np.ndarray, float] | None = None
    for free in itertools.chain.from_iterable(itertools.combinations((0, 1), k) for k in range(3)):
        x = np.column_stack([g, *(columns[i] for i in free)])
        coef, *_ = np.linalg.lstsq(x, target, rcond=None)
        if any(c < 0 for c in coef[1:]):
            continue
        sse = float(np.sum((target - x @ coef) ** 2))
        full = np.zeros(3)
        full[0] = coef[0]
        for k, i in enumerate(free):
            full[1 + i] = coef[1 + k]
        if best is None or sse < best[1] - 1e-15:
            best = (full, sse)
    assert best is not None  # the empty active set is always feasible
    return best


def _search(sse_of: Callable[[float], float], lo: float, hi: float, steps: int = 301) -> float:
    """Minimise a 1-D function: a grid, then golden-section between the best point's neighbours."""
    grid = np.linspace(lo, hi, steps)
    values = [sse_of(float(x)) for x in grid]
    i = int(np.argmin(values))
    a, b = float(grid[max(0, i - 1)]), float(grid[min(steps - 1, i + 1)])
    ratio = (math.sqrt(5) - 1) / 2
    c, d = b - ratio * (b - a), a + ratio * (b - a)
    fc, fd = sse_of(c), sse_of(d)
    for _ in range(40):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - ratio * (b - a)
            fc = sse_of(c)
        else:
            a, c, fc = c, d, fd
            d = a + ratio * (b - a)
            fd = sse_of(d)
    x = (a + b) / 2
    return x if sse_of(x) <= values[i] else float(grid[i])


def fit_mode(obs: Sequence[Observation], *, prior_exponent: float = 1.0,
             bounds: tuple[float, float] = EXPONENT_RANGE) -> ModeFit:
    """Fit base, per_sm, per_dram and saturation_exponent of one sharing mode."""
    if len(obs) < 3:
        raise ValueError(f"need at least 3 observations to fit 3+ parameters, got {len(obs)}")
    sm, dram, osm, odram, y = _arrays(obs)
    over = np.maximum(np.maximum(sm + osm, dram + odram), 1.0)
    identified = bool(np.any(over > 1.0 + 1e-9))

    def sse_of(e: float) -> float:
        return _solve_linear(over**e, osm, odram, y)[1]

    e = _search(sse_of, *bounds) if identified else prior_exponent
    coef, sse = _solve_linear(over**e, osm, odram, y)
    params = ModeParams(base=float(coef[0]), per_sm=float(coef[1]), per_dram=float(coef[2]),
                        saturation_exponent=float(e))
    return ModeFit(params, len(obs), math.sqrt(sse / len(obs)), identified)


def fit_power(busy: Sequence[float], watts: Sequence[float], *,
              prior_exponent: float = 1.0) -> PowerFit:
    """Fit idle/max watts and the exponent of ``idle + (max - idle) * busy ** e``."""
    b = np.clip(np.asarray(busy, dtype=float), 0.0, 1.0)
    w = np.asarray(watts, dtype=float)
    if len(b) < 2 or np.ptp(b) == 0:
        raise ValueError("need power readings at two or more different activity levels")
    interior = np.unique(np.round(b[(b > 1e-6) & (b < 1 - 1e-6)], 6))
    identified = len(np.unique(np.round(b, 6))) >= 3 and len(interior) >= 1

    def solve(e: float) -> tuple[np.ndarray, float]:
        x = np.column_stack([np.ones_like(b), b**e])
        coef, *_ = np.linalg.lstsq(x, w, rcond=None)
        return coef, float(np.sum((w - x @ coef) ** 2))

    e = _search(lambda v: solve(v)[1], *POWER_EXPONENT_RANGE) if identified else prior_exponent
    coef, sse = solve(e)
    return PowerFit(float(coef[0]), float(coef[0] + coef[1]), float(e), len(b),
                    math.sqrt(sse / len(b)), identified)


def split_groups(groups: Sequence[str], *, holdout: float, seed: int) -> tuple[set[str], set[str]]:
    """(train, held-out) sets of mixes; none held out when fewer than 3 mixes exist."""
    unique = sorted(set(groups))
    if holdout <= 0 or len(unique) < 3:
        return set(unique), set()
    rng = np.random.default_rng(seed)
    order = [unique[i] for i in rng.permutation(len(unique))]
    k = min(len(unique) - 2, max(1, round(holdout * len(unique))))
    return set(order[k:]), set(order[:k])


def errors(params: ModeParams, obs: Sequence[Observation]) -> dict[str, float | int | None]:
    """Absolute error of predicted per-job slowdown: median, max, mean; and the count."""
    if not obs:
        return {"n": 0, "median_abs_error": None, "max_abs_error": None, "mean_abs_error": None}
    err = np.abs(predict(params, obs) - np.array([o.slowdown for o in obs]))
    return {"n": len(obs), "median_abs_error": float(np.median(err)),
            "max_abs_error": float(err.max()), "mean_abs_error": float(err.mean())}
