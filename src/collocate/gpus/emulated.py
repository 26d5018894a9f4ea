"""The emulated backend: N GPUs of a named type on a machine that has none.

Emulated jobs (``collocate emulate-job``) are real processes that claim emulated memory in a
state directory shared with the daemon (see ``emulated_state``), so the daemon, OOM recovery and
the demo run for real in CI. Readings derive from the live claims and the interference model:
used memory is the sum of claims, SM/DRAM activity the capped sum of the claimants' solo
activities, power ``InterferenceModel.power_watts`` with the type's idle/max watts, and energy
the integral of that power over the samples (persisted, so it is monotonic across processes).

Spec grammar (after ``emulated:``): a cluster spec as ``gputypes.parse_cluster`` reads it,
then optional ``:mig<i>=<profile>,<profile>`` parts that split GPU ``i`` into MIG instances, e.g.
``emulated:2xA100-40GB:mig0=3g.20gb,4g.20gb``, or a ``:mig=`` part that splits every GPU alike,
as ``simulate --mig-layout`` does (``emulated:4xA100-40GB:mig=3g.20gb+4g.20gb``; a ``mig<i>``
part overrides it for GPU ``i``). A single-node spec takes the ``node`` name given (the host,
for the daemon); multi-node specs keep ``node0``, ``node1``, ... and take no MIG parts.
"""

from __future__ import annotations

import os
import re
import sqlite3
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import astuple, replace
from pathlib import Path

from collocate.common.errors import CollocateError, InputError
from collocate.core.gputypes import GpuType, NodeSpec, gpu_type, parse_cluster
from collocate.core.interference import InterferenceModel, default_interference, on_device
from collocate.core.model import GpuId, JobProfile
from collocate.gpus.base import DeviceInfo, DeviceSample, ProcessUsage
from collocate.gpus.emulated_state import (
    Claim,
    DeviceRow,
    StateStore,
    read_devices,
    read_live_claims,
)
from collocate.gpus.mig_profiles import mig_profile, place, sm_fraction, split_profiles

ENV_STATE_DIR = "COLLOCATE_EMULATED_DIR"  # where jobs find the state (the daemon sets it)
_MIG_PART = re.compile(r"^mig(\d*)=(.+)$")


def gpu_uuid(node: str, index: int) -> str:
    """Stable fake UUID of an emulated GPU; the node is in it so UUIDs are cluster-unique."""
    return f"GPU-emu-{node}-{index}"


def mig_uuid(node: str, index: int, gi: int) -> str:
    return f"MIG-emu-{node}-{index}-{gi}"


def parse_spec(spec: str) -> tuple[tuple[NodeSpec, ...], dict[int, list[str]]]:
    """Split ``2xA100-40GB:mig0=3g.20gb,4g.20gb`` into the cluster and the MIG layout."""
    cluster_text, *parts = spec.split(":")
    nodes = parse_cluster(cluster_text)
    every: list[str] = []
    mig: dict[int, list[str]] = {}
    for part in parts:
        match = _MIG_PART.match(part.strip())
        if not match:
            raise InputError(
                f"cannot read emulated GPU option {part!r} in {spec!r}",
                hint="write MIG layouts as :mig<gpu index>=<profile>,<profile>, or :mig=<layout> "
                "for every GPU, e.g. emulated:2xA100-40GB:mig0=3g.20gb,4g.20gb",
            )
        profiles = [p for item in match[2].split(",") for p in split_profiles(item)]
        if match[1]:
            mig[int(match[1])] = profiles
        else:
            every = profiles
    if every:
        mig = {i: every for i in range(sum(n.count for n in nodes))} | mig
    return nodes, mig


class EmulatedBackend:
    """GPUs that exist only in ``state_dir``; see the module docstring for the spec grammar."""

    name = "emulated"
    needs_mps_server = False  # emulated jobs model MPS sharing themselves

    def __init__(
        self,
        state_dir: Path,
        *,
        interference: InterferenceModel | None = None,
    ) -> None:
        """Attach to existing state (what jobs and extra readers do); ``create`` makes it."""
        self.store = StateStore.open_existing(Path(state_dir))
        self.emulated_state_dir: Path | None = Path(state_dir)
        self.model = interference or default_interference()
        self._keeper: sqlite3.Connection | None = None

    @classmethod
    def create(
        cls,
        state_dir: Path,
        spec: str,
        *,
        node: str,
        mig: Mapping[int, Sequence[str]] | None = None,
        interference: InterferenceModel | None = None,
    ) -> EmulatedBackend:
        """Lay out the devices of ``spec`` in ``state_dir`` (kept as-is when they already match).

        ``mig`` adds to or overrides the ``:mig<i>=`` parts of the spec. Re-creating over an
        existing state keeps energy counters and the claims of jobs still running, and refuses to
        remove a device that a live job holds.
        """
        nodes, spec_mig = parse_spec(spec)
        layout = {**spec_mig, **{int(k): list(v) for k, v in (mig or {}).items()}}
        if len(nodes) == 1:
            nodes = (NodeSpec(node, nodes[0].gpu_type, nodes[0].count),)
        elif layout:
            raise InputError(
                f"MIG layouts need a single-node emulated spec, got {spec!r}",
                hint="use e.g. emulated:2xA100-40GB:mig0=3g.20gb,4g.20gb",
            )
        store = StateStore(Path(state_dir))
        store.create()
        rows: list[DeviceRow] = []
        for n in nodes:
            for index in range(n.count):
                profiles = layout.pop(index, None) if n.name == nodes[0].name else None
                rows += _device_rows(n.name, n.gpu_type, index, profiles, start_ord=len(rows))
        if layout:
            raise InputError(
                f"MIG layout names GPU(s) {sorted(layout)} but the spec has {nodes[0].count}",
                hint="GPU indices start at 0",
            )
        _replace_devices(store, lambda _current: rows)
        backend = cls(Path(state_dir), interference=interference)
        backend._keeper = store.keep_open()  # the daemon's: its -wal and -shm stay put
        return backend

    # -- GpuBackend ------------------------------------------------------------------------

    def devices(self) -> list[DeviceInfo]:
        return [_info(d) for d in self.store.devices()]

    def sample(self) -> list[DeviceSample]:
        """Read every device from the live claims; also collects the claims of dead processes."""
        devices = self.store.devices()
        claims = self.store.live_claims(collect=True)
        now = time.time()
        by_uuid: dict[str, list[Claim]] = {d.uuid: [] for d in devices}
        for c in claims:
            by_uuid.setdefault(c.uuid, []).append(c)
        watts = {
            d.uuid: self.model.power_watts(d.idle_watts, d.max_watts, _profiles(by_uuid[d.uuid]))
            for d in devices
            if d.parent_uuid is None
        }
        joules = self.store.advance_energy(watts, now)
        return [
            _sample(d, by_uuid[d.uuid], now, watts.get(d.uuid), joules.get(d.uuid))
            for d in devices
        ]

    def close(self) -> None:
        """Every call opens and closes its own connection; only the creator's keeper stays."""
        if self._keeper is not None:
            self._keeper.close()
            self._keeper = None

    # -- emulated-only MIG reconfiguration -------------------------------------------------

    def create_mig_instances(
        self, index: int, profiles: Sequence[str], *, node: str | None = None,
        reconfigure_emulated: bool = False,
    ) -> list[DeviceInfo]:
        """Split emulated GPU ``index`` into MIG instances (emulated GPUs only, never a real one).

        ``reconfigure_emulated=True`` must be passed on purpose: collocate never reconfigures a
        real GPU, and this flag keeps a caller from doing so by accident through a generic path.
        Refused while a live job holds the GPU or one of its instances.
        """
        self._check_flag(reconfigure_emulated)
        return self._set_mig(index, list(profiles), node)

    def destroy_mig_instances(
        self, index: int, *, node: str | None = None, reconfigure_emulated: bool = False
    ) -> list[DeviceInfo]:
        """Turn emulated GPU ``index`` back into one whole device (same flag and refusal rules)."""
        self._check_flag(reconfigure_emulated)
        return self._set_mig(index, None, node)

    @staticmethod
    def _check_flag(flag: bool) -> None:
        if not flag:
            raise CollocateError(
                "MIG reconfiguration is only for emulated GPUs and needs reconfigure_emulated=True",
                hint="collocate never changes MIG on a real GPU; "
                "an admin does that with nvidia-smi",
            )

    def _set_mig(
        self, index: int, profiles: list[str] | None, node: str | None
    ) -> list[DeviceInfo]:
        made: list[DeviceRow] = []

        def rebuild(current: list[DeviceRow]) -> list[DeviceRow]:
            where = node or (current[0].node if current else "")
            whole = [d for d in current if d.node == where and d.idx == index]
            if not whole:
                raise InputError(f"no emulated GPU {where}:{index}",
                                 hint="see `devices()` for the list")
            made.extend(_device_rows(where, gpu_type(whole[0].type_name), index, profiles,
                                     start_ord=min(d.ord for d in whole)))
            return _renumber([d for d in current if d not in whole], made)

        _replace_devices(self.store, rebuild)
        return [_info(d) for d in made]


def state_dir_from_env(explicit: Path | None = None) -> Path:
    """The state dir a job uses: ``explicit`` (a flag) or ``$COLLOCATE_EMULATED_DIR``."""
    if explicit is not None:
        return explicit
    value = os.environ.get(ENV_STATE_DIR)
    if not value:
        raise CollocateError(
            f"no emulated GPU state directory: {ENV_STATE_DIR} is not set",
            hint="run the job through the daemon (it sets it), or pass --state-dir",
        )
    return Path(value)


def _device_rows(
    node: str, gpu: GpuType, index: int, profiles: Sequence[str] | None, *, start_ord: int
) -> list[DeviceRow]:
    if not profiles:
        return [
            DeviceRow(gpu_uuid(node, index), start_ord, node, index, None, gpu.name,
                      float(gpu.memory_mib), gpu.sm_count, 1.0, None, None,
                      gpu.idle_watts, gpu.max_watts)
        ]
    place(gpu.name, list(profiles))  # raises if this set cannot coexist on one GPU
    rows = []
    for gi, name in enumerate(profiles, start=1):
        p = mig_profile(gpu.name, name)
        if p.memory_mib is None or p.sm_count is None:
            raise InputError(
                f"MIG profile {name} of {gpu.name} has no measured size, so it cannot be emulated",
                hint="use another profile; its numbers were never captured from a real GPU",
            )
        rows.append(
            DeviceRow(mig_uuid(node, index, gi), start_ord + gi - 1, node, index, f"{gi}.0",
                      gpu.name, p.memory_mib, p.sm_count, sm_fraction(gpu.name, p.sm_count, name),
                      gpu_uuid(node, index), name, gpu.idle_watts, gpu.max_watts)
        )
    return rows


def _renumber(others: list[DeviceRow], new: list[DeviceRow]) -> list[DeviceRow]:
    merged = sorted(others + new, key=lambda d: (d.node, d.idx, d.mig or ""))
    return [replace(d, ord=i) for i, d in enumerate(merged)]


def _replace_devices(
    store: StateStore, rebuild: Callable[[list[DeviceRow]], list[DeviceRow]]
) -> None:
    """Swap in ``rebuild(current devices)`` in one transaction (concurrent changes serialise),
    refusing to drop a device that a live job holds memory on."""
    with store.tx() as db:
        current = read_devices(db)
        rows = rebuild(current)
        keep = {r.uuid for r in rows}
        held = {c.uuid for c in read_live_claims(db, delete_dead=True)}
        busy = sorted(u for u in held if u in {d.uuid for d in current} and u not in keep)
        if busy:
            raise CollocateError(
                f"cannot remove emulated device(s) {', '.join(busy)}: live jobs hold memory there",
                hint="stop those jobs first (or use a fresh --state-dir)",
            )
        db.execute("DELETE FROM devices")
        db.executemany(
            "INSERT INTO devices VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [astuple(r) for r in rows],
        )
        db.execute(
            f"DELETE FROM energy WHERE uuid NOT IN ({','.join('?' * len(keep)) or 'NULL'})",
            tuple(keep),
        )


def _info(d: DeviceRow) -> DeviceInfo:
    return DeviceInfo(
        id=GpuId(d.node, d.idx, d.mig),
        uuid=d.uuid,
        type_name=d.type_name,
        total_mib=d.total_mib,
        sm_count=d.sm_count,
        parent_uuid=d.parent_uuid,
        mig_profile=d.mig_profile,
        minor=d.idx,  # as if /dev/nvidia<index>: a job's cgroup denies the other GPUs' numbers
    )


def _profiles(claims: Sequence[Claim]) -> list[JobProfile]:
    """What the claims make the GPU do: solo activities at each job's current rate."""
    return [JobProfile(c.sm * c.rate, c.dram * c.rate) for c in claims]


def _sample(
    d: DeviceRow, claims: list[Claim], now: float, watts: float | None, joules: float | None
) -> DeviceSample:
    """One reading. On a MIG instance activities are relative to the instance's share of SMs.
    A job slowed down by its neighbours keeps the GPU busy at its solo activity times its rate,
    as a real GPU's counters read (measured on an H100: docs/gpu-validation.md)."""
    sm = [on_device(c.sm * c.rate, d.sm_fraction) for c in claims]
    dram = [on_device(c.dram * c.rate, d.sm_fraction) for c in claims]
    sm_total, dram_total = float(sum(sm)), float(sum(dram))
    used = float(sum(c.mib for c in claims))
    per_pid: dict[int, list[float]] = {}
    for c, a in zip(claims, sm, strict=True):
        share = a / max(1.0, sm_total)
        entry = per_pid.setdefault(c.pid, [0.0, 0.0])
        entry[0] += c.mib
        entry[1] += share
    return DeviceSample(
        uuid=d.uuid,
        time=now,
        used_mib=used,
        free_mib=max(0.0, d.total_mib - used),
        gpu_util=1.0 if sm_total > 0 else 0.0,  # NVML's kernel-running fraction saturates
        sm_activity=min(1.0, sm_total),
        sm_occupancy=None,
        dram_activity=min(1.0, dram_total),
        power_watts=watts,
        energy_joules=joules,
        processes=tuple(
            ProcessUsage(pid, mib, min(1.0, share)) for pid, (mib, share) in sorted(per_pid.items())
        ),
    )
