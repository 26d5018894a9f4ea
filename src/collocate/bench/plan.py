"""The benchmark plan: which workloads run together, how many copies, under which sharing mode.

Pure and printable (``collocate bench run --list``), so a GPU session knows before it starts what
it will run and roughly how long it takes, and tests check the enumeration without running it.
Order matters: the solo runs come first (every slowdown is relative to them, and their memory
decides which many-copy scenarios fit), then pairs and mixes (the calibration data), then 3 and 7
copies. A run can stop at a time budget and resume where it stopped.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from collocate.bench.workloads import DEFAULT_WORKLOADS, workload
from collocate.common.errors import InputError
from collocate.core.model import SharingMode

SHARING_MODES = tuple(m.value for m in SharingMode)
ALONE = "alone"  # a single process on the GPU: the sharing mode does not apply
DEFAULT_COPIES = (1, 2, 3, 7)

#: Mixes of different workloads (large + small, medium + small, ...). ResNet-152 + DLRM is the
#: published anchor pair the packaged interference parameters were solved from.
DEFAULT_MIXES: tuple[tuple[str, ...], ...] = (
    ("resnet152", "dlrm"),
    ("resnet152", "resnet18-cifar"),
    ("resnet50-224", "resnet18-cifar"),
    ("resnet50-64", "resnet18-cifar"),
    ("transformer-encoder", "dlrm"),
    ("transformer-encoder", "resnet50-224"),
    ("resnet152", "resnet50-64", "resnet18-cifar"),
)


@dataclass(frozen=True, slots=True)
class Scenario:
    """A set of workloads started together on one GPU under one sharing mode."""

    jobs: tuple[str, ...]
    sharing: str  # "alone", "time-slicing" or "mps"

    @property
    def id(self) -> str:
        """Stable name, e.g. ``mps:resnet152+dlrm`` or ``time-slicing:3x resnet18-cifar``."""
        counts = Counter(self.jobs)
        if len(counts) == 1:
            (name, n), = counts.items()
            body = name if n == 1 else f"{n}x {name}"
        else:
            body = "+".join(self.jobs)
        return f"{self.sharing}:{body}"

    @property
    def kind(self) -> str:
        if len(self.jobs) == 1:
            return "alone"
        return "copies" if len(set(self.jobs)) == 1 else "mix"


def build_plan(
    workloads: Sequence[str] = DEFAULT_WORKLOADS,
    *,
    copies: Sequence[int] = DEFAULT_COPIES,
    mixes: Iterable[Sequence[str]] = DEFAULT_MIXES,
    sharing: Sequence[str] = SHARING_MODES,
) -> list[Scenario]:
    """Every scenario, in run order: alone, then 2 copies and mixes, then larger copy counts.

    Mixes naming a workload outside ``workloads`` are dropped, so ``--workloads`` narrows the
    whole plan consistently.
    """
    for name in workloads:
        workload(name)  # raises with the valid names
    for mode in sharing:
        if mode not in SHARING_MODES:
            raise InputError(f"unknown sharing mode {mode!r}",
                             hint=f"valid: {', '.join(SHARING_MODES)}")
    bad = [c for c in copies if c < 1]
    if bad:
        raise InputError(f"copies must be >= 1, got {bad}")
    chosen = set(workloads)
    plan: list[Scenario] = []
    if 1 in copies:
        plan += [Scenario((w,), ALONE) for w in workloads]
    kept_mixes = [tuple(m) for m in mixes if set(m) <= chosen and len(m) > 1]
    for n in sorted(c for c in set(copies) if c > 1):
        for mode in sharing:
            plan += [Scenario((w,) * n, mode) for w in workloads]
            if n == 2:
                plan += [Scenario(m, mode) for m in kept_mixes]
    if 2 not in copies:  # mixes still belong to the plan
        for mode in sharing:
            plan += [Scenario(m, mode) for m in kept_mixes]
    return plan


def parse_mix(text: str) -> tuple[str, ...]:
    """``resnet152+dlrm`` → ``("resnet152", "dlrm")``, names checked."""
    names = tuple(p.strip() for p in text.split("+") if p.strip())
    if len(names) < 2:
        raise InputError(f"a mix needs at least two workloads, got {text!r}",
                         hint="write e.g. resnet152+dlrm")
    for name in names:
        workload(name)
    return names


def estimate_seconds(plan: Sequence[Scenario], *, warmup_s: float, seconds: float,
                     startup_s: float = 12.0) -> float:
    """Rough wall time of a plan: start-up (imports, CUDA context), warm-up and measurement."""
    return len(plan) * (startup_s + warmup_s + seconds)


def format_plan(plan: Sequence[Scenario], *, warmup_s: float, seconds: float) -> str:
    lines = [f"{i + 1:3d}. {s.id}  ({len(s.jobs)} process{'es' if len(s.jobs) > 1 else ''})"
             for i, s in enumerate(plan)]
    total = estimate_seconds(plan, warmup_s=warmup_s, seconds=seconds)
    lines.append(f"{len(plan)} scenarios, about {total / 60:.0f} min at {warmup_s:g} s warm-up + "
                 f"{seconds:g} s measurement each (scenarios that cannot fit in GPU memory are "
                 "skipped at run time)")
    return "\n".join(lines)
