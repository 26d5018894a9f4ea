"""Least-squares fits of the interference and power models (numpy only).

Interference (``collocate.core.interference.shared_slowdown``), per sharing mode::

    slowdown = (1 + base + per_sm * S_o + per_dram * D_o) * max(1, A, D) ** e

For a fixed exponent ``e`` this is *linear* in (base, per_sm, per_dram): with
``g = max(1, A, D) ** e`` the residual is ``slowdown - g - g*base - g*S_o*per_sm - g*D_o*per_dram``.
So the fit is variable projection: a 1-D search over ``e`` (a grid, then finer nested grids)
with an exact linear least-squares solve inside, in slowdown units. ``per_sm`` and ``per_dram``
are kept >= 0 by solving every active set of the two (an exact non-negative solve for two
variables); ``base`` is free. When no observation over-subscribes the GPU (all
``max(1, A, D) == 1``) the exponent cannot be identified and keeps its prior.

``shared_slowdown`` clamps its result at 1 (sharing never speeds a job up); the solve above fits
the unclamped formula, a least-squares surrogate that is exact whenever every fitted prediction
is >= 1. Every error reported here (``ModeFit.rmse``, ``errors``, ``cross_validate``) is of
``predict``, i.e. of the clamped predictions the simulator uses.

Held-out error is leave-one-mix-out (``cross_validate``): each mix in turn is left out, the model
fitted on the others predicts its jobs. Relative error ``|predicted / measured - 1|`` is the
headline; absolute error grows with the slowdown itself (7 copies slow down up to ~7x).

Power: ``watts = idle + (max - idle) * busy ** e``, linear in (idle, max - idle) for fixed ``e``;
``busy`` is the GPU's measured SM activity (see ``collocate.bench.calibrate``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from collocate.core.interference import ModeParams, shared_slowdown

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
    group: str  # the mix it belongs to (cross-validation leaves a mix out whole)


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


_ACTIVE_SETS = ((0, 1, 2), (0, 1), (0, 2), (0,))  # free coefficients of (base, per_sm, per_dram)


def _solve_linear(g: np.ndarray, osm: np.ndarray, odram: np.ndarray,
                  y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each row ``g[k]`` of a (K, n) array: min ||y - g*(1 + b + s*osm + d*odram)|| with
    s, d >= 0. Returns the coefficients (b, s, d), shape (K, 3), and the SSE, shape (K,).

    Every active set is solved (a pseudo-inverse, batched over K) and the best feasible one kept;
    the problem is convex, so that is the constrained optimum.
    """
    x = g[:, :, None] * np.column_stack([np.ones_like(osm), osm, odram])[None]
    target = (y - g)[:, :, None]
    best_coef = np.zeros((len(g), 3))
    best_sse = np.full(len(g), np.inf)
    for free in _ACTIVE_SETS:
        xf = x[:, :, free]
        coef = np.linalg.pinv(xf) @ target
        sse = np.sum((target - xf @ coef) ** 2, axis=(1, 2))
        better = np.all(coef[:, 1:, 0] >= 0, axis=1) & (sse < best_sse - 1e-15)
        best_coef[better] = 0.0
        best_coef[np.ix_(better, free)] = coef[better, :, 0]
        best_sse[better] = sse[better]
    return best_coef, best_sse


def _search(sse_of: Callable[[np.ndarray], np.ndarray], lo: float, hi: float,
            steps: int = 301, refine: int = 7) -> float:
    """Minimise a 1-D function, vectorised (an array of points in, their values out): a grid,
    then ``refine`` finer grids of 21 points between the best point's neighbours, each one a
    tenth as wide (so the last bracket is 2 (hi - lo) / (steps - 1) / 10**refine wide)."""
    grid = np.linspace(lo, hi, steps)
    i = int(np.argmin(sse_of(grid)))
    for _ in range(refine):  # each finer grid contains the best point so far
        grid = np.linspace(grid[max(0, i - 1)], grid[min(len(grid) - 1, i + 1)], 21)
        i = int(np.argmin(sse_of(grid)))
    return float(grid[i])


def fit_mode(obs: Sequence[Observation], *, prior_exponent: float = 1.0,
             bounds: tuple[float, float] = EXPONENT_RANGE) -> ModeFit:
    """Fit base, per_sm, per_dram and saturation_exponent of one sharing mode."""
    if len(obs) < 3:
        raise ValueError(f"need at least 3 observations to fit 3+ parameters, got {len(obs)}")
    sm, dram, osm, odram, y = _arrays(obs)
    over = np.maximum(np.maximum(sm + osm, dram + odram), 1.0)
    identified = bool(np.any(over > 1.0 + 1e-9))

    def sse_of(exponents: np.ndarray) -> np.ndarray:
        return _solve_linear(over[None, :] ** exponents[:, None], osm, odram, y)[1]

    e = _search(sse_of, *bounds) if identified else prior_exponent
    coef = _solve_linear(over[None, :] ** e, osm, odram, y)[0][0]
    params = ModeParams(base=float(coef[0]), per_sm=float(coef[1]), per_dram=float(coef[2]),
                        saturation_exponent=float(e))
    rmse = math.sqrt(float(np.mean((predict(params, obs) - y) ** 2)))
    return ModeFit(params, len(obs), rmse, identified)


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

    def sse_of(exponents: np.ndarray) -> np.ndarray:
        return np.array([solve(float(v))[1] for v in exponents])

    e = _search(sse_of, *POWER_EXPONENT_RANGE) if identified else prior_exponent
    coef, sse = solve(e)
    return PowerFit(float(coef[0]), float(coef[0] + coef[1]), float(e), len(b),
                    math.sqrt(sse / len(b)), identified)


def cross_validate(obs: Sequence[Observation]) -> np.ndarray:
    """Leave-one-mix-out predictions: for each mix, the model fitted on all other mixes predicts
    that mix's jobs. Returns one out-of-fold prediction per observation, in order."""
    groups = np.array([o.group for o in obs])
    unique = sorted(set(groups.tolist()))
    if len(unique) < 3:
        raise ValueError(f"need at least 3 mixes to leave one out, got {len(unique)}")
    out = np.empty(len(obs))
    for group in unique:
        held = groups == group
        train = [o for o, h in zip(obs, held, strict=True) if not h]
        test = [o for o, h in zip(obs, held, strict=True) if h]
        if len(train) < 3:
            raise ValueError(f"leaving out mix {group} leaves {len(train)} observations, "
                             "fewer than 3")
        out[held] = predict(fit_mode(train).params, test)
    return out


def errors(predicted: Sequence[float] | np.ndarray,
           measured: Sequence[float] | np.ndarray) -> dict[str, float | int]:
    """Error of predicted per-job slowdown against the measured one.

    Absolute ``|p - m|``: median, max, mean. Relative ``|p / m - 1|``: median, 90th percentile
    (linear interpolation between order statistics), max.
    """
    p, m = np.asarray(predicted, dtype=float), np.asarray(measured, dtype=float)
    if p.shape != m.shape or p.size == 0:
        raise ValueError(f"need equally many predictions and measurements, got {p.size} and "
                         f"{m.size}")
    err, rel = np.abs(p - m), np.abs(p / m - 1.0)
    return {"n": int(p.size), "median_abs_error": float(np.median(err)),
            "max_abs_error": float(err.max()), "mean_abs_error": float(err.mean()),
            "median_rel_error": float(np.median(rel)),
            "p90_rel_error": float(np.percentile(rel, 90)), "max_rel_error": float(rel.max())}
