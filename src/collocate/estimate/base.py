"""The estimate every memory estimator returns, whatever produced it.

Why one type: the scheduler compares an estimate plus headroom against a GPU's free memory and
must never care which estimator answered (DESIGN.md, "Estimators are providers"). It only needs
a number, where it came from and how far to trust it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

MIB = float(1 << 20)

#: The methods an ``Estimate`` can name, and what each means.
METHODS: dict[str, str] = {
    "traced": "one training step traced on fake tensors, replayed through the allocator model",
    "cpu-run": "short real CPU runs at small batch sizes, extrapolated and replayed",
    "analytical": "parameter count and batch-1 activation sizes, scaled (no backward traced)",
    "history": "measured peak of an earlier run of the same job signature",
    "declared": "the user's own --mem",
    "horus": "baseline: Horus formula as CARMA used it",
    "faketensor": "baseline: live fake-tensor bytes after backward, as CARMA used it",
    "none": "no estimate; the job needs --mem or a GPU of its own",
}

#: Breakdown keys, in display order.
BREAKDOWN_KEYS = (
    "parameters",
    "gradients",
    "optimizer_state",
    "activations",
    "allocator_overhead",
    "workspace",
    "context",
)


@dataclass(frozen=True)
class Estimate:
    """Peak GPU memory of one job, as seen by other processes on the GPU.

    ``mib`` is the point estimate in MiB (``math.inf`` when there is none); ``uncertainty`` is a
    relative half-width (0.15 means the truth is expected within ±15%); ``breakdown`` lists its
    parts in MiB and sums to ``mib`` when it is given.
    """

    mib: float
    method: str
    uncertainty: float
    breakdown: dict[str, float] = field(default_factory=dict)
    note: str = ""
    details: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"unknown estimate method {self.method!r}; one of {sorted(METHODS)}")
        if not (self.mib > 0 or math.isinf(self.mib)):
            raise ValueError(f"an estimate must be positive MiB, got {self.mib!r}")
        if self.uncertainty < 0:
            raise ValueError(f"uncertainty must be >= 0, got {self.uncertainty!r}")

    @property
    def available(self) -> bool:
        """False for the "no estimate" result: schedule only with --mem or a whole GPU."""
        return self.method != "none" and math.isfinite(self.mib)

    @property
    def upper_mib(self) -> float:
        """The conservative end of the estimate: ``mib * (1 + uncertainty)``."""
        return self.mib * (1.0 + self.uncertainty)

    @classmethod
    def none(cls, reason: str) -> Estimate:
        """The result when no estimator could answer; ``reason`` says why and what to do."""
        return cls(mib=math.inf, method="none", uncertainty=0.0, note=reason)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready form (``inf`` becomes ``None``)."""
        d = asdict(self)
        d["mib"] = self.mib if math.isfinite(self.mib) else None
        d["upper_mib"] = self.upper_mib if math.isfinite(self.mib) else None
        return d


def breakdown_mib(parts_bytes: dict[str, float]) -> dict[str, float]:
    """Convert a bytes breakdown to MiB, in ``BREAKDOWN_KEYS`` order, rounded to 0.1 MiB."""
    ordered = [k for k in BREAKDOWN_KEYS if k in parts_bytes]
    ordered += [k for k in parts_bytes if k not in BREAKDOWN_KEYS]
    return {k: round(parts_bytes[k] / MIB, 1) for k in ordered}
