"""What multi-node changes in the single-node daemon: nothing imports Ray, and a GPU that cannot
be read (its node is away) is left out of the snapshot, so no policy places a job on it."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from collocate.core import policies
from collocate.core.model import GpuId, Job
from collocate.core.scheduler import Capacity, Scheduler
from collocate.daemon.gpu_watch import GpuWatch
from collocate.gpus.base import DeviceInfo, DeviceSample


def test_single_node_mode_never_imports_ray(tmp_path: Path):
    """The daemon's modules, and a single-node daemon that opened and ran a round."""
    code = textwrap.dedent(f"""
        import sys
        import collocate.cli, collocate.daemon.service
        from collocate.daemon.service import ServeConfig, Service
        from pathlib import Path
        service = Service(ServeConfig(Path({str(tmp_path / "state")!r}), gpus="emulated:1xA100-40GB"))
        service.layout.create()
        service.open()
        service.round.run()
        service.close()
        print(sorted(m for m in sys.modules if m == "ray" or m.startswith(("ray.", "collocate.cluster"))))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


class TwoNodes:
    """Two nodes of one GPU each; node ``b`` does not answer."""

    name = "two-nodes"
    emulated_state_dir = None
    needs_mps_server = False

    def devices(self) -> list[DeviceInfo]:
        return [DeviceInfo(GpuId(n, 0), f"GPU-{n}", "fake", 16384.0, 1) for n in "ab"]

    def sample(self) -> list[DeviceSample]:
        return [DeviceSample("GPU-a", 0.0, 0.0, 16384.0),
                DeviceSample("GPU-b", 0.0, 16384.0, 0.0, reachable=False)]

    def close(self) -> None:
        pass


@pytest.mark.parametrize("policy", ["exclusive", "auto", "carma-magm", "round-robin", "declared-memory", "shares"])
def test_an_unreachable_gpu_takes_no_job(policy: str):
    watch = GpuWatch(TwoNodes(), window=3)
    watch.read()
    watch.observe({}, now=0.0)
    snapshot = watch.snapshot(0.0)
    assert [str(g) for g in snapshot.ids] == ["a:0"]
    scheduler = Scheduler(policies.make_policy(policy), Capacity.of(snapshot))
    for i in range(3):
        scheduler.submit(Job(str(i + 1), mem_mib=1000.0, mem_source="declared"))
    plan = scheduler.schedule(snapshot)
    assert plan.placements, "the reachable GPU takes a job"
    assert all(str(g) == "a:0" for p in plan.placements for g in p.gpus)
