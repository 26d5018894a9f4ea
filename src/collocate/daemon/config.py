"""The daemon's configuration, and the typed wiring its parts share.

``ServeConfig`` is everything ``collocate serve`` takes, validated by the CLI before the daemon
starts. ``Wiring`` is what the composition root (``service.Service``) hands each part of the
loop (attempts, the round, the API): one typed object instead of a dict of parts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from collocate.core.model import SharingMode
from collocate.core.policies.risk import WINDOW_SAMPLES
from collocate.core.recovery import RecoveryRules
from collocate.daemon.quotas import Quotas
from collocate.daemon.tracking import TrackingConfig
from collocate.node.cgroups import DEFAULT_MAX_PIDS
from collocate.node.confine import NodeBounds

if TYPE_CHECKING:
    from collocate.core.scheduler import Scheduler
    from collocate.daemon.fleet import Fleet
    from collocate.daemon.gpu_watch import GpuWatch
    from collocate.daemon.store import Store
    from collocate.daemon.tracking import DaemonTracking
    from collocate.wire.paths import StateLayout
    from collocate.wire.spec import JobSpec


@dataclass(frozen=True)
class ServeConfig:
    """Everything ``collocate serve`` takes; validated by the CLI before the daemon starts."""

    state_dir: Path
    gpus: str = "auto"
    policy: str = "auto"
    policy_params: dict[str, Any] = field(default_factory=dict)
    sharing: SharingMode = SharingMode.TIME_SLICING
    period_s: float = 1.0
    window: int = WINDOW_SAMPLES
    allow_gid: int | None = None
    tcp: tuple[str, int] | None = None
    token: str | None = None
    cancel_grace_s: float = 10.0
    rules: RecoveryRules = field(default_factory=RecoveryRules)
    #: Whether a waiting job of higher priority freezes running ones of lower priority
    #: (``collocate.core.preemption``); off, it waits as in a plain priority queue. Jobs started on
    #: trial are taken back either way (``collocate.core.suspension``).
    preemption: bool = True
    #: Whether a pile-up of trial jobs on a GPU is taken back in one step rather than one job per
    #: settling period (``SuspendRules.at_once``; off by default, docs/policies.md).
    take_back_at_once: bool = False
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    ray: str | None = None  # a Ray cluster's address: run as its head (docs/multi-node.md)
    node_grace_s: float = 60.0  # with ``ray``: how long a silent node's jobs stay unconfirmed
    quotas: Quotas = field(default_factory=Quotas)  # what one member may hold (daemon/quotas.py)
    job_max_pids: int | None = DEFAULT_MAX_PIDS  # per attempt, in its cgroup
    job_max_memory: int | None = None  # host memory per attempt (bytes); accounted either way
    #: TCP over TLS: the certificate and key files, or (both None and ``tls_self_signed``) the
    #: daemon's own, made once under ``<state dir>/tls`` (``collocate.common.tls``).
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_self_signed: bool = False
    user_tokens: dict[str, str] = field(default_factory=dict)  # token → member (``--user-tokens``)
    tcp_max_per_token: int = 8  # TCP connections served at once per token holder
    warm_estimator: bool = False  # keep a warm estimator process (``estimate/warm.py``; serve: on where torch is)


def job_bounds(config: ServeConfig) -> NodeBounds:
    """What every attempt's runner enforces, wherever it runs (``node/confine.py``); a node
    takes the disk-relative defaults of its own disk."""
    return NodeBounds(max_pids=config.job_max_pids, max_memory=config.job_max_memory,
                      log_max=config.quotas.log_max, disk_reserve=config.quotas.disk_reserve)


@dataclass(frozen=True, slots=True)
class Wiring:
    """The parts of a running daemon that its loop's parts share (all owned by the loop thread)."""

    config: ServeConfig
    layout: StateLayout
    store: Store
    scheduler: Scheduler
    specs: dict[str, JobSpec]
    tracking: DaemonTracking
    watch: GpuWatch
    fleet: Fleet
