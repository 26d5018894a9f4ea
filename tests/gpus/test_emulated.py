"""The emulated backend: devices, MIG instances, claims, liveness, power and energy."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from collocate.common.errors import CollocateError, InputError
from collocate.core.gputypes import GPU_TYPES
from collocate.core.model import GpuId
from collocate.gpus.emulated import EmulatedBackend, parse_spec
from collocate.gpus.emulated_state import StateStore, process_start_time

from ._gpu_helpers import NODE, holders

A100 = GPU_TYPES["A100-40GB"]


def claim(backend: EmulatedBackend, uuid: str, pid: int, mib: float, sm: float = 0.5) -> None:
    started = process_start_time(pid)
    assert started is not None
    assert backend.store.claim(uuid, pid, started, mib, sm, 0.1) is None


def test_devices_have_stable_uuids_and_the_type_sizes(backend: EmulatedBackend) -> None:
    devices = backend.devices()
    assert [d.uuid for d in devices] == [f"GPU-emu-{NODE}-0", f"GPU-emu-{NODE}-1"]
    assert devices[1].id == GpuId(NODE, 1)
    assert devices[0].total_mib == A100.memory_mib and devices[0].sm_count == A100.sm_count
    again = EmulatedBackend.create(backend.store.state_dir, "2xA100-40GB", node=NODE)
    assert again.devices() == devices


def test_idle_sample(backend: EmulatedBackend) -> None:
    s = backend.sample()[0]
    assert (s.used_mib, s.free_mib, s.sm_activity, s.processes) == (0.0, A100.memory_mib, 0.0, ())
    assert s.power_watts == pytest.approx(A100.idle_watts)


def test_sample_reports_claims_activity_power_and_shares(backend: EmulatedBackend) -> None:
    uuid = backend.devices()[0].uuid
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        claim(backend, uuid, os.getpid(), 1000, sm=0.6)
        claim(backend, uuid, sleeper.pid, 3000, sm=0.9)
        s = backend.sample()[0]
        assert s.used_mib == 4000 and s.free_mib == A100.memory_mib - 4000
        assert s.sm_activity == 1.0  # 0.6 + 0.9 saturates
        assert s.power_watts == pytest.approx(A100.max_watts)
        shares = {p.pid: p.sm_util for p in s.processes}
        assert shares[os.getpid()] == pytest.approx(0.6 / 1.5)
        assert shares[sleeper.pid] == pytest.approx(0.9 / 1.5)
        assert backend.sample()[1].used_mib == 0  # the other GPU is untouched
    finally:
        sleeper.kill()
        sleeper.wait()
    assert sleeper.pid not in holders(backend, uuid)  # dead claimant collected at next sample


def test_a_reused_pid_does_not_keep_a_dead_claim(backend: EmulatedBackend) -> None:
    uuid = backend.devices()[0].uuid
    real_start = process_start_time(os.getpid())
    assert real_start is not None
    # a claim recorded by an earlier process that had our pid: same pid, other start time
    assert backend.store.claim(uuid, os.getpid(), real_start - 100.0, 2048, 0.5, 0.1) is None
    assert holders(backend, uuid) == {}
    assert backend.store.live_claims() == []


def test_claims_beyond_capacity_are_refused_with_the_numbers(backend: EmulatedBackend) -> None:
    uuid = backend.devices()[0].uuid
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        claim(backend, uuid, sleeper.pid, 30_000)
        started = process_start_time(os.getpid())
        assert started is not None
        refusal = backend.store.claim(uuid, os.getpid(), started, 12_000, 0.5, 0.1)
        assert refusal is not None
        assert refusal.requested_mib == 12_000 and refusal.total_mib == A100.memory_mib
        assert refusal.free_mib == A100.memory_mib - 30_000
        assert refusal.others == ((sleeper.pid, 30_000),)
        assert backend.store.claim(uuid, os.getpid(), started, 10_000, 0.5, 0.1) is None
    finally:
        sleeper.kill()
        sleeper.wait()


def test_energy_is_integrated_monotonic_and_persisted(backend: EmulatedBackend) -> None:
    uuid = backend.devices()[0].uuid
    claim(backend, uuid, os.getpid(), 1000, sm=1.0)
    readings = []
    for _ in range(4):
        s = backend.sample()[0]
        readings.append((s.time, s.energy_joules, s.power_watts))
        time.sleep(0.05)
    energies = [e for _, e, _ in readings]
    assert all(b > a for a, b in zip(energies[1:], energies[2:], strict=False))
    span = readings[-1][0] - readings[1][0]
    assert energies[-1] - energies[1] == pytest.approx(A100.max_watts * span, rel=0.05)
    reopened = EmulatedBackend(backend.store.state_dir)  # another process reading the same state
    assert reopened.sample()[0].energy_joules >= energies[-1]
    recreated = EmulatedBackend.create(backend.store.state_dir, "2xA100-40GB", node=NODE)
    assert recreated.sample()[0].energy_joules >= energies[-1]


def test_mig_instances_replace_their_parent(state_dir: Path) -> None:
    backend = EmulatedBackend.create(state_dir, "2xA100-40GB:mig1=3g.20gb,4g.20gb", node=NODE)
    devices = backend.devices()
    assert [d.mig_profile for d in devices] == [None, "3g.20gb", "4g.20gb"]
    three, four = devices[1], devices[2]
    assert three.uuid.startswith("MIG-emu-") and three.uuid != four.uuid
    assert three.parent_uuid == four.parent_uuid == f"GPU-emu-{NODE}-1"
    assert (three.total_mib, three.sm_count) == (19.5 * 1024, 42)
    assert (four.total_mib, four.sm_count) == (19.5 * 1024, 56)
    assert three.id.index == four.id.index == 1 and three.id.mig != four.id.mig
    assert (devices[0].sm_fraction, three.sm_fraction, four.sm_fraction) == (1.0, 42 / 98, 56 / 98)
    samples = backend.sample()
    assert samples[1].power_watts is None and samples[1].energy_joules is None  # NVML: per GPU only


def test_one_layout_splits_every_gpu_as_the_simulator_does(state_dir: Path) -> None:
    """``:mig=`` is ``simulate --mig-layout``: the daemon's devices are the simulator's."""
    from collocate.core.gputypes import parse_cluster
    from collocate.sim.mig import MigInstances, resolve_layout

    backend = EmulatedBackend.create(state_dir, "2xA100-40GB:mig=3g.20gb+4g.20gb", node=NODE)
    nodes = parse_cluster("2xA100-40GB")
    nodes = (replace(nodes[0], name=NODE),)
    simulated = MigInstances(nodes, resolve_layout("3g.20gb+4g.20gb", nodes))
    emulated = backend.devices()
    assert [d.id for d in emulated] == simulated.ids
    assert [d.sm_fraction for d in emulated] == simulated.speed
    assert [d.total_mib for d in emulated] == simulated.total_mib
    mixed = EmulatedBackend.create(state_dir, "2xA100-40GB:mig=3g.20gb,4g.20gb:mig1=7g.40gb", node=NODE)
    assert [d.mig_profile for d in mixed.devices()] == ["3g.20gb", "4g.20gb", "7g.40gb"]


def test_mig_option_and_h100_sizes(state_dir: Path) -> None:
    backend = EmulatedBackend.create(state_dir, "1xH100-80GB", node=NODE, mig={0: ["1g.20gb", "2g.20gb"]})
    assert [(d.mig_profile, d.sm_count) for d in backend.devices()] == [("1g.20gb", 26), ("2g.20gb", 32)]


def test_mig_activity_is_relative_to_the_instance(state_dir: Path) -> None:
    backend = EmulatedBackend.create(state_dir, "1xA100-40GB:mig0=3g.20gb,4g.20gb", node=NODE)
    uuid = backend.devices()[0].uuid
    claim(backend, uuid, os.getpid(), 1000, sm=0.2)
    assert backend.sample()[0].sm_activity == pytest.approx(0.2 / (42 / 98))


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("2xA100-40GB:mig0=3g.20gb,3g.20gb,3g.20gb", "compute slices"),
        ("2xA100-40GB:mig5=3g.20gb", "GPU indices"),
        ("2xA100-40GB:mog0=3g.20gb", "cannot read emulated GPU option"),
        ("1xH200-141GB:mig0=7g.141gb", "no measured size"),
        ("2x(1xA100-40GB):mig0=3g.20gb", "single-node"),
        ("1xL4-24GB:mig0=3g.20gb", "MIG-capable"),
    ],
)
def test_bad_mig_specs(state_dir: Path, spec: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        EmulatedBackend.create(state_dir, spec, node=NODE)


def test_multi_node_spec_keeps_node_names(state_dir: Path) -> None:
    backend = EmulatedBackend.create(state_dir, "2x(2xA100-40GB)", node="ignored")
    assert [str(d.id) for d in backend.devices()] == ["node0:0", "node0:1", "node1:0", "node1:1"]
    assert len({d.uuid for d in backend.devices()}) == 4
    assert parse_spec("4xA100-40GB")[1] == {}


def test_mig_reconfiguration_needs_the_flag_and_a_free_gpu(backend: EmulatedBackend) -> None:
    with pytest.raises(CollocateError, match="reconfigure_emulated=True"):
        backend.create_mig_instances(1, ["3g.20gb"])
    made = backend.create_mig_instances(1, ["3g.20gb", "3g.20gb"], reconfigure_emulated=True)
    assert [d.mig_profile for d in made] == ["3g.20gb", "3g.20gb"]
    assert [d.mig_profile for d in backend.devices()] == [None, "3g.20gb", "3g.20gb"]
    claim(backend, made[0].uuid, os.getpid(), 100)
    with pytest.raises(CollocateError, match="live jobs hold memory"):
        backend.destroy_mig_instances(1, reconfigure_emulated=True)
    backend.store.release(os.getpid())
    backend.destroy_mig_instances(1, reconfigure_emulated=True)
    assert [d.uuid for d in backend.devices()] == [f"GPU-emu-{NODE}-0", f"GPU-emu-{NODE}-1"]


def test_jobs_need_existing_state(tmp_path: Path) -> None:
    with pytest.raises(CollocateError, match="no emulated GPU state"):
        EmulatedBackend(tmp_path / "nothing")
    assert not StateStore(tmp_path / "nothing").path.exists()
