"""Lower bounds on a trace's makespan: how far any policy could go on a cluster.

A policy's makespan means little alone; measured against exclusive *and* against what is
physically possible it tells how much of the gain it takes. Three floors, each a valid lower
bound on the makespan (from the first arrival, as ``SimResult.makespan_s``) of any schedule the
simulator could produce:

* **arrival floor**: no job ends before it arrived plus its solo duration (sharing never
  speeds a job up), so ``max_j(arrival_j + duration_j)``; it covers "last arrival + shortest
  completion" and "any job's own duration".
* **SM floor**: a GPU's realized SM activity is at most 1 and a job consumes ``solo SM activity
  x solo duration`` of it per GPU whatever its slowdown, so ``sum_j(gpus_j x duration_j x sm_j) /
  GPUs`` (and at least the arrival floor's longest job).
* **model floor**: the fluid relaxation of the simulator itself. A *mix* is a multiset of jobs
  on one GPU whose peaks fit its memory; in it each member progresses at ``1 / slowdown`` from
  the calibrated interference model (``collocate.core.interference``), alone at 1. Minimise the time
  T such that the GPU-time given to mixes (at most GPUs x T per GPU type) covers every job's
  work. Jobs of the same profile and peak are one type (on traces with
  more than ``MAX_TYPES`` of them, rounded down). Solved by column generation:
  a restricted LP (scipy's HiGHS) over the mixes found so far, and a greedy search for mixes
  that price out. Greedy pricing can miss mixes, so the LP's value alone is only an upper
  estimate of the fluid optimum; the **certified** floor comes from LP duality: any prices y
  give ``sum_t y_t W_t / sum_g G_g P_g(y)``, with ``P_g`` an upper bound on the best mix's value
  on GPU type g. Two such bounds, both charging every member the slowdown at a box's lower
  corner (slowdowns only grow with co-runners' activity): a continuous knapsack per box of
  (total SM, total DRAM), cheap but loose by up to a job's worth of memory filled with a
  fraction of one; and an exact search, integer knapsacks (MILPs) per box of (load,
  saturation), which also finds the mixes greedy missed and becomes exact as boxes shrink
  (``_price``). ``model_floor_s`` is the best certified bound (and at least the arrival floor);
  ``model_lp_s`` the LP's value; their gap says how tight it is.

Multi-GPU jobs are relaxed: a k-GPU job is k independent shards of its solo duration each, one
per GPU, that may sit in different mixes and progress at different rates (a real gang advances
at its slowest shard, on one node); that only lowers the bound, so it stays valid.

Not modelled by the floor: arrivals beyond the arrival floor (the LP sees all work at time 0),
memory ramp-up and the estimators' margins (mixes fit the measured peaks), which only make real
schedules slower; and start-up or warm-up phases (``--startup-s``, a trace's ``warmup_s``), which
run beside anything at full speed, so with them the model floor is no longer a strict bound.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from collocate.common.errors import CollocateError, InputError
from collocate.core.gputypes import NodeSpec
from collocate.core.interference import InterferenceModel, ModeParams, default_interference
from collocate.core.model import SharingMode
from collocate.sim.trace import TraceJob

#: Continuous knapsacks the pricing bound may solve per GPU type (it stops at the best bound left).
BOUND_LPS = 3000
#: Exact pricing (integer knapsacks over boxes of load and saturation, ``_price``): rounds of it
#: per solve, knapsacks per round and GPU type, and the certificate's target (relative to the
#: best mix, and to the LP's value). Where a round stops short, its bound is the largest left.
EXACT_ROUNDS = 3
BOUND_CELLS = 300
CERTIFY_TOLERANCE = 1e-3
#: Each knapsack stops at this relative gap or this many branch-and-bound nodes; its bound is
#: then the solver's dual bound (or the continuous relaxation's), so it stays valid.
MILP_GAP = 1e-4
MILP_NODES = 2000
MAX_ROUNDS = 400
#: Beyond this many distinct (profile, peak) job types (synthetic traces: every job), activities
#: are rounded down to 0.1 and peaks to a quarter octave (at most 16% less), which keeps the LP small and the bound valid.
MAX_TYPES = 60
#: Job types each pricing round grows a mix from (the best priced per MiB).
GREEDY_STARTS = 40
#: Largest mix the greedy search grows (the certificate has no such limit).
MAX_MIX = 64


@dataclass(frozen=True)
class Floors:
    arrival_floor_s: float
    sm_floor_s: float
    model_floor_s: float | None  # certified lower bound; None where not computed (MIG)
    model_lp_s: float | None  # value of the column-generation LP (>= the certified bound)
    mixes: int  # columns the LP ended with
    job_types: int

    def as_dict(self) -> dict:
        return asdict(self)


def floors(
    jobs: Sequence[TraceJob],
    nodes: Sequence[NodeSpec],
    sharing: SharingMode = SharingMode.TIME_SLICING,
    model: InterferenceModel | None = None,
    *,
    mig: bool = False,
) -> Floors:
    """Arrival, SM and model floors of ``jobs`` on ``nodes`` (seconds from the first arrival);
    with ``mig`` (GPUs split into MIG instances) no model floor: the fluid LP knows whole GPUs."""
    if not jobs:
        raise InputError("the trace has no jobs")
    first = min(j.arrival_s for j in jobs)
    per_node = max(n.count for n in nodes)
    fits = [j for j in jobs if j.workload.gpus <= per_node
            and j.workload.peak_mib <= max(n.gpu_type.memory_mib for n in nodes)]
    if not fits:
        raise InputError("no job of the trace fits the cluster", hint="check --cluster against the jobs' GPUs and peaks")
    gpus = sum(n.count for n in nodes)
    arrival = max(j.arrival_s - first + j.workload.duration_s for j in fits)
    longest = max(j.workload.duration_s for j in fits)
    sm_work = sum(j.workload.gpus * j.workload.duration_s * j.workload.profile.sm_activity for j in fits)
    sm_floor = max(sm_work / gpus, longest)
    if mig:
        return Floors(arrival, sm_floor, None, None, 0, 0)
    model = model or default_interference()
    lp = _FluidLP(fits, nodes, model.modes[sharing])
    value, bound = lp.solve(enough=arrival)
    return Floors(arrival, sm_floor, float(max(bound, arrival)), float(max(value, arrival)), len(lp.columns),
                  lp.n_types)


def gap_closed(makespan: float, exclusive: float, floor: float) -> float:
    """Share of the exclusive-to-floor gap a policy's makespan closes (1 = at the floor; < 0 =
    worse than exclusive)."""
    if exclusive <= floor:
        return float("nan")
    return (exclusive - makespan) / (exclusive - floor)


class _FluidLP:
    """Column generation for the fluid relaxation (see the module docstring)."""

    def __init__(self, jobs: Sequence[TraceJob], nodes: Sequence[NodeSpec], params: ModeParams) -> None:
        types: dict[tuple, float] = {}
        for j in jobs:
            w = j.workload
            key = (w.profile.sm_activity, w.profile.dram_activity, w.peak_mib)
            types[key] = types.get(key, 0.0) + w.gpus * w.duration_s  # k shards of a k-GPU job
        if len(types) > MAX_TYPES:  # rounding activity and memory down only lowers the bound
            coarse: dict[tuple, float] = {}
            for (a, d, m), work in types.items():
                key = (_down(a, 0.1), _down(d, 0.1), float(2.0 ** _down(np.log2(max(m, 1.0)), 0.25)))
                coarse[key] = coarse.get(key, 0.0) + work
            types = coarse
        keys = sorted(types)
        self.n_types = len(keys)
        self.sm = np.array([k[0] for k in keys])
        self.dram = np.array([k[1] for k in keys])
        self.mem = np.array([k[2] for k in keys])
        self.work = np.array([types[k] for k in keys])
        self.params = params
        gpu_types: dict[str, list] = {}
        for n in nodes:
            gpu_types.setdefault(n.gpu_type.name, [n.gpu_type.memory_mib, 0])[1] += n.count
        self.gpu_mem = np.array([v[0] for v in gpu_types.values()], dtype=float)
        self.gpu_count = np.array([v[1] for v in gpu_types.values()], dtype=float)
        self.columns: list[tuple[int, np.ndarray]] = []  # (GPU type, counts per job type)
        for g, m in enumerate(self.gpu_mem):  # every job type alone: the exclusive schedule
            for t in np.flatnonzero(self.mem <= m):
                counts = np.zeros(self.n_types)
                counts[t] = 1
                self.columns.append((g, counts))

    # -- the model -------------------------------------------------------------------------
    def rates(self, counts: np.ndarray) -> np.ndarray:
        """Work per second each job type gets in a mix with these counts (count / slowdown)."""
        n = counts.sum()
        if n <= 1:
            return counts.astype(float)
        return counts / self._slowdown(float(counts @ self.sm), float(counts @ self.dram))

    def _slowdown(self, total_sm, total_dram):
        """Slowdown of each job type in a mix of at least two with these activity totals."""
        p = self.params
        s = 1.0 + p.base + p.per_sm * (total_sm - self.sm) + p.per_dram * (total_dram - self.dram)
        if p.saturation_exponent:
            s = s * max(1.0, total_sm, total_dram) ** p.saturation_exponent
        return np.maximum(s, 1.0)

    # -- the master LP ---------------------------------------------------------------------
    def _master(self):
        linprog = _linprog()

        k = len(self.columns)
        n_g = len(self.gpu_mem)
        # variables: x_0..x_{k-1} (GPU-seconds in each mix), T
        c = np.zeros(k + 1)
        c[-1] = 1.0
        rates = np.array([self.rates(counts) for _, counts in self.columns]).T  # types x columns
        a_work = np.hstack([-rates, np.zeros((self.n_types, 1))])
        a_cap = np.zeros((n_g, k + 1))
        for i, (g, _) in enumerate(self.columns):
            a_cap[g, i] = 1.0
        a_cap[:, -1] = -self.gpu_count
        res = linprog(c, A_ub=np.vstack([a_work, a_cap]), b_ub=np.concatenate([-self.work, np.zeros(n_g)]),
                      bounds=(0, None), method="highs")
        if res.status != 0:
            raise CollocateError(f"floor LP failed: {res.message}")
        y = -res.ineqlin.marginals[: self.n_types]  # prices of a second of each type's work
        return float(res.fun), np.maximum(y, 0.0)

    def solve(self, enough: float = 0.0) -> tuple[float, float]:
        """The LP's value and the best certified bound. Greedy pricing adds mixes while it finds
        any. Then the continuous bound (``_certified``) is one candidate, and exact searches
        (``_price``) add the mixes greedy missed and certify their own, up to ``EXACT_ROUNDS``
        while each beats the best bound so far (under MPS 300 knapsacks rarely do) and the LP's
        value is above ``enough`` (a floor known otherwise, such as the arrival floor). Every
        bound is valid: the largest is returned."""
        value, y = self._master()
        bound, exact_rounds = 0.0, 0
        for _ in range(MAX_ROUNDS):
            added = self._add_greedy(y)
            if not added and exact_rounds < EXACT_ROUNDS and enough < value:
                bound = max(bound, self._certified(y))
                if bound >= value / (1 + CERTIFY_TOLERANCE):
                    break
                exact_rounds += 1
                certified, added = self._exact_round(y)
                if certified <= bound:
                    exact_rounds = EXACT_ROUNDS  # the search is too coarse here: no more rounds
                bound = max(bound, certified)
            if not added:
                break
            value, y = self._master()
        bound = max(bound, self._certified(y))
        return value, min(bound, value)

    def _best_known(self, y: np.ndarray, g: int) -> float:
        return max((float(y @ self.rates(c)) for gg, c in self.columns if gg == g), default=0.0)

    def _add_greedy(self, y: np.ndarray) -> int:
        """Add the greedy search's mixes that price out (beat the best column in the LP, whose
        value is the GPU type's capacity dual); how many."""
        added = 0
        for g in range(len(self.gpu_mem)):
            best_known = self._best_known(y, g)
            for counts in self._greedy(y, self.gpu_mem[g]):
                if float(y @ self.rates(counts)) > best_known * (1 + 1e-6):
                    self.columns.append((g, counts))
                    added += 1
        return added

    def _exact_round(self, y: np.ndarray) -> tuple[float, int]:
        """The bound prices ``y`` certify with the exact search, after adding the best mix it
        found on each GPU type where that prices out; and how many it added."""
        worth = float(y @ self.work)
        capacity, added = 0.0, 0
        for g, (count, mem) in enumerate(zip(self.gpu_count, self.gpu_mem, strict=True)):
            known = self._best_known(y, g)
            best, mix = self._price(y, mem, known)
            capacity += count * best
            if mix is not None and float(y @ self.rates(mix)) > known * (1 + 1e-6):
                self.columns.append((g, mix))
                added += 1
        return (worth / capacity if worth > 0 and capacity > 0 else 0.0), added

    def _greedy(self, y: np.ndarray, mem_limit: float) -> list[np.ndarray]:
        """Mixes grown one job at a time from the best-priced job types, taking the addition
        that raises the mix's priced value most while memory fits; the best mix of each path."""
        found = []
        p = self.params
        starts = np.argsort(-y / np.maximum(self.mem, 1.0), kind="stable")[:GREEDY_STARTS]
        for start in starts:
            if self.mem[start] > mem_limit or y[start] <= 0:
                continue
            counts = np.zeros(self.n_types)
            counts[start] = 1
            mem = self.mem[start]
            best, best_counts = float(y[start]), counts.copy()
            for _ in range(MAX_MIX):
                cand = np.flatnonzero(self.mem <= mem_limit - mem)
                if cand.size == 0:
                    break
                # totals after adding each candidate (rows), slowdown of every type (columns)
                s_tot = counts @ self.sm + self.sm[cand][:, None]
                d_tot = counts @ self.dram + self.dram[cand][:, None]
                slow = 1.0 + p.base + p.per_sm * (s_tot - self.sm) + p.per_dram * (d_tot - self.dram)
                if p.saturation_exponent:
                    slow = slow * np.maximum(1.0, np.maximum(s_tot, d_tot)) ** p.saturation_exponent
                after = counts + np.eye(self.n_types)[cand]
                values = (after * y / np.maximum(slow, 1.0)).sum(axis=1)
                i = int(np.argmax(values))
                counts[cand[i]] += 1
                mem += self.mem[cand[i]]
                if values[i] > best:
                    best, best_counts = float(values[i]), counts.copy()
                elif values[i] < 0.5 * best:  # past the top, and far: stop this path
                    break
            if best_counts.sum() > 1:
                found.append(best_counts)
        return found

    def _price(self, y: np.ndarray, mem_limit: float, known: float) -> tuple[float, np.ndarray | None]:
        """An upper bound on the priced value of any mix that fits ``mem_limit``, and the best
        mix of two or more found on the way (None if none beat a single job or ``known``).

        A member's slowdown depends on the mix only through two numbers: its co-runners' load
        ``L = per_sm x total SM + per_dram x total DRAM`` and the saturation ``M = max(1, total
        SM, total DRAM)``, and grows with both. So branch and bound over boxes of (L, M): in a
        box, every member is at least as slow as at the box's lower corner, so an integer
        knapsack priced there (a small MILP) bounds every mix inside, and its solution is a real
        mix, valued at its own totals. Boxes are halved along the axis that moves the slowdown
        most (only L under time-slicing, whose fitted saturation exponent is 0), best bound
        first, until none can beat the best mix by ``CERTIFY_TOLERANCE`` or ``BOUND_CELLS``
        knapsacks were solved; the bound is then the largest left. The continuous knapsack
        (``_certified``) left the certificate 4-18% under the LP on the CARMA traces
        time-sliced (a fraction of a job fills the memory); this one closes heavy-60's exactly.
        Integer knapsacks over boxes of (total SM, total DRAM) needed thousands per round."""
        import heapq

        fit = self.mem <= mem_limit
        best = max(known, float(y[fit].max()) if fit.any() else 0.0)
        idx = np.flatnonzero(fit & (y > 0))
        most = np.floor(mem_limit / np.maximum(self.mem[idx], 1.0))
        if most.sum() < 2:
            return best, None
        p = self.params
        s_max, d_max = float(most @ self.sm[idx]), float(most @ self.dram[idx])
        top_box = (0.0, p.per_sm * s_max + p.per_dram * d_max, 1.0, max(1.0, s_max, d_max))
        best_mix: np.ndarray | None = None

        def slowdown(load: float, saturation: float) -> np.ndarray:
            s = 1.0 + p.base + load - p.per_sm * self.sm[idx] - p.per_dram * self.dram[idx]
            return np.maximum(s * saturation ** p.saturation_exponent, 1.0)

        def bound(box: tuple[float, float, float, float]) -> float:
            nonlocal best, best_mix
            value, x = self._knapsack(y[idx] / slowdown(box[0], box[2]), most, mem_limit, idx, box)
            if x is not None:
                counts = np.zeros(self.n_types)
                counts[idx] = x
                mix_value = float(y @ self.rates(counts))
                if mix_value > best:
                    best, best_mix = mix_value, counts
            return value

        heap = [(-bound(top_box), top_box)]
        solved = 1
        while heap and -heap[0][0] > best * (1 + CERTIFY_TOLERANCE) and solved < BOUND_CELLS:
            _, (l0, l1, m0, m1) = heapq.heappop(heap)
            here = slowdown(l0, m0)
            if np.max(slowdown(l1, m0) / here) >= np.max(slowdown(l0, m1) / here):
                halves = ((l0, (l0 + l1) / 2, m0, m1), ((l0 + l1) / 2, l1, m0, m1))
            else:
                halves = ((l0, l1, m0, (m0 + m1) / 2), (l0, l1, (m0 + m1) / 2, m1))
            for half in halves:
                value = bound(half)
                solved += 1
                if value > best * (1 + CERTIFY_TOLERANCE):
                    heapq.heappush(heap, (-value, half))
        return max(best, -heap[0][0] if heap else 0.0), best_mix

    def _knapsack(self, value: np.ndarray, most: np.ndarray, mem_limit: float, idx: np.ndarray,
                  box: tuple[float, float, float, float]) -> tuple[float, np.ndarray | None]:
        """Max of ``value @ counts`` over integer mixes of two or more in ``mem_limit`` whose
        (L, M) lie in ``box``: an upper bound (the solver's dual bound, or the continuous
        relaxation's, where it stopped early) and its best mix; (-inf, None) where no mix does.
        ``M >= m0 > 1`` means total SM or total DRAM reaches m0: one knapsack for each."""
        milp, bounds, constraint = _milp()
        l0, l1, m0, m1 = box
        p = self.params
        sm, dram = self.sm[idx], self.dram[idx]
        rows = [self.mem[idx], p.per_sm * sm + p.per_dram * dram, sm, dram, np.ones(idx.size)]
        low, high = [-np.inf, l0, -np.inf, -np.inf, 2.0], [mem_limit, l1, m1, m1, np.inf]
        best: tuple[float, np.ndarray | None] = (-np.inf, None)
        for reach in ((2, 3) if m0 > 1.0 else (None,)):  # total SM >= m0, or total DRAM >= m0
            lo = list(low)
            if reach is not None:
                lo[reach] = m0
            limits = constraint(np.vstack(rows), lo, high)
            res = milp(-value, integrality=np.ones(idx.size), bounds=bounds(0, most), constraints=limits,
                       options={"mip_rel_gap": MILP_GAP, "node_limit": MILP_NODES})
            if res.status == 2:  # infeasible: no mix has totals in this box
                continue
            x = None if res.x is None else np.round(res.x)
            dual = getattr(res, "mip_dual_bound", None)
            if res.status == 0:
                found = -float(res.fun)
            elif dual is not None and np.isfinite(dual):  # stopped early (node limit): its dual bound
                found = -float(dual)
            else:  # stopped before it had a bound: the continuous relaxation is one
                relaxed = milp(-value, integrality=np.zeros(idx.size), bounds=bounds(0, most), constraints=limits)
                if relaxed.status == 2:
                    continue
                if relaxed.status != 0:
                    raise CollocateError(f"floor pricing failed: {res.message}; {relaxed.message}")
                found = -float(relaxed.fun)
            if found > best[0]:
                best = (found, x if x is not None else best[1])
        return best

    # -- the certificate -------------------------------------------------------------------
    def _certified(self, y: np.ndarray) -> float:
        """LP-duality lower bound from prices ``y``: sum y W / sum_g G_g P_g(y)."""
        worth = float(y @ self.work)
        if worth <= 0:
            return 0.0
        capacity = 0.0
        for g, (count, mem) in enumerate(zip(self.gpu_count, self.gpu_mem, strict=True)):
            known = max((float(y @ self.rates(c)) for gg, c in self.columns if gg == g), default=0.0)
            capacity += count * self._pricing_bound(y, mem, known)
        return worth / capacity

    def _pricing_bound(self, y: np.ndarray, mem_limit: float, known: float = 0.0) -> float:
        """An upper bound on the priced value of any mix that fits ``mem_limit``.

        Cells of (total SM, total DRAM) are bounded by a continuous knapsack priced at the
        cell's lower corner; cells whose bound beats ``known`` (the best mix found) are split,
        best first, until they are small or ``BOUND_LPS`` knapsacks were solved."""
        import heapq

        linprog = _linprog()

        fit = self.mem <= mem_limit
        single = float(y[fit].max()) if fit.any() else 0.0
        known = max(known, single)
        idx = np.flatnonzero(fit & (y > 0))
        if idx.size == 0:
            return single
        sm, dram, mem, price = self.sm[idx], self.dram[idx], self.mem[idx], y[idx]
        per_mib = np.maximum(mem, 1.0)
        s_max = float(mem_limit * np.max(sm / per_mib)) + 1e-9  # most activity any mix can hold
        d_max = float(mem_limit * np.max(dram / per_mib)) + 1e-9
        a_ub = np.vstack([mem, sm, -sm, dram, -dram, -np.ones(idx.size)])

        def bound(s0, s1, d0, d1) -> float:
            v = price / self._slowdown(s0, d0)[idx]
            if float(np.max(v / per_mib)) * mem_limit <= known:  # cheap: best value per MiB
                return known
            res = linprog(-v, A_ub=a_ub, b_ub=[mem_limit, s1, -s0, d1, -d0, -2.0], bounds=(0, None),
                          method="highs")
            return -float(res.fun) if res.status == 0 else -np.inf

        heap = [(-np.inf, 0.0, s_max, 0.0, d_max)]
        solved = 0
        while heap:
            neg, s0, s1, d0, d1 = heapq.heappop(heap)
            if -neg <= known:
                continue
            if solved >= BOUND_LPS or (s1 - s0 <= s_max / 256 and d1 - d0 <= d_max / 256):
                return max(known, -neg)  # the largest bound left: nothing can beat it
            sm_mid, d_mid = (s0 + s1) / 2, (d0 + d1) / 2
            for cell in ((s0, sm_mid, d0, d_mid), (sm_mid, s1, d0, d_mid), (s0, sm_mid, d_mid, d1),
                         (sm_mid, s1, d_mid, d1)):
                b = bound(*cell)
                solved += 1
                if b > known:
                    heapq.heappush(heap, (-b, *cell))
        return known


def _scipy():
    """scipy.optimize, or an error saying how to get it (the floor's only optional dependency)."""
    try:
        from scipy import optimize
    except ImportError:
        raise CollocateError(
            "the model floor needs scipy (its HiGHS LP solver)",
            hint="pip install 'collocate[floor]' (or scipy>=1.11)",
        ) from None
    return optimize


def _linprog():
    return _scipy().linprog


def _milp():
    optimize = _scipy()
    return optimize.milp, optimize.Bounds, optimize.LinearConstraint


def _down(value: float, step: float) -> float:
    return float(np.floor(value / step + 1e-9) * step)
