"""`collocate emulate-job` as real processes on emulated GPUs."""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from collocate.common.errors import InputError
from collocate.core.gputypes import gpu_type
from collocate.core.interference import default_interference
from collocate.core.model import JobProfile, SharingMode
from collocate.gpus.emulated import EmulatedBackend
from collocate.gpus.emulated_state import Refusal
from collocate.node.emulate_job import JobSpec, oom_message, torch_size

from ._gpu_helpers import NODE, holders, wait_for

GPU0 = f"GPU-emu-{NODE}-0"
GPU1 = f"GPU-emu-{NODE}-1"
_OOM = re.compile(
    r"torch\.OutOfMemoryError: CUDA out of memory\. Tried to allocate [\d.]+ GiB\. GPU 0 has a total"
    r" capacity of 39\.59 GiB of which [\d.]+ GiB is free\. Process \d+ has [\d.]+ GiB memory in use\."
)


def finish(proc: subprocess.Popen, timeout: float = 30) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def solo_seconds(out: str) -> float:
    match = re.search(r"done in ([\d.]+)s", out)
    assert match, out
    return float(match[1])


def test_two_jobs_fit_a_third_fails_like_cuda_and_leaves_no_claim(backend: EmulatedBackend, start_job) -> None:
    a = start_job("--mem", "15GiB", "--seconds", "60", "--ramp", "0")
    b = start_job("--mem", "15GiB", "--seconds", "60", "--ramp", "0")
    wait_for(lambda: len(holders(backend, GPU0)) == 2, what="two claims")
    assert sorted(holders(backend, GPU0).values()) == [15 * 1024, 15 * 1024]

    c = start_job("--mem", "12GiB", "--seconds", "60", "--ramp", "0")
    code, out, err = finish(c)
    assert code == 1
    assert _OOM.search(err), err
    assert "Tried to allocate 12.00 GiB" in err and "of which 9.59 GiB is free" in err
    assert c.pid not in holders(backend, GPU0)
    assert set(holders(backend, GPU0)) == {a.pid, b.pid}

    a.send_signal(signal.SIGTERM)
    code, out, _ = finish(a)
    assert code == 143 and "terminated" in out
    assert set(holders(backend, GPU0)) == {b.pid}  # released at once, not by liveness
    b.terminate()
    finish(b)


def test_sigkill_claim_disappears_at_next_sample(backend: EmulatedBackend, start_job) -> None:
    job = start_job("--mem", "2GiB", "--seconds", "60", "--ramp", "0")
    wait_for(lambda: job.pid in holders(backend, GPU0), what="the claim")
    job.kill()  # no cleanup runs in the job
    os.waitid(os.P_PID, job.pid, os.WEXITED | os.WNOWAIT)  # dead, but left a zombie (not reaped)
    assert holders(backend, GPU0) == {}
    assert backend.sample()[0].used_mib == 0


def test_memory_ramps_up_in_steps(backend: EmulatedBackend, start_job) -> None:
    job = start_job("--mem", "4GiB", "--seconds", "60", "--ramp", "1.2")
    seen: set[float] = set()

    def full() -> bool:
        seen.update(holders(backend, GPU0).values())
        return 4096.0 in seen

    wait_for(full, what="the full claim")
    assert {1024.0, 4096.0} <= seen
    job.terminate()
    finish(job)


def test_collocated_jobs_take_longer_than_alone(backend: EmulatedBackend, start_job) -> None:
    args = ("--mem", "1GiB", "--seconds", "1.5", "--sm", "0.8", "--dram", "0.3", "--ramp", "0")
    alone = start_job(*args, devices=GPU1)
    code, out, _ = finish(alone)
    assert code == 0
    t_alone = solo_seconds(out)
    assert 1.5 <= t_alone < 1.5 + 0.5  # one tick past the end, plus scheduling delay under load

    pair = [start_job(*args), start_job(*args)]
    results = [finish(p) for p in pair]
    assert [r[0] for r in results] == [0, 0]
    times = [solo_seconds(r[1]) for r in results]
    model = default_interference()
    predicted = model.slowdown(SharingMode.TIME_SLICING, JobProfile(0.8, 0.3), [JobProfile(0.8, 0.3)])
    assert predicted > 1.5
    # both overlap for most of their run; process start-up skew makes the slower one a bit less
    assert max(times) / t_alone > 0.8 * predicted
    assert min(times) / t_alone > 1.3
    assert f"slowdown {predicted:.3f}" in results[0][1] + results[1][1]  # the model, applied


def test_a_shared_emulated_gpu_reads_the_realized_activity_of_its_slowed_jobs(
    backend: EmulatedBackend, start_job
) -> None:
    # As on an H100: two time-sliced jobs of SM activity 0.8 keep the GPU busy at 2 * 0.8 / slowdown,
    # not at min(1, 1.6); power follows that reading.
    args = ("--mem", "1GiB", "--seconds", "30", "--sm", "0.8", "--dram", "0.3", "--ramp", "0")
    pair = [start_job(*args), start_job(*args)]
    profile = JobProfile(0.8, 0.3)
    slowdown = default_interference().slowdown(SharingMode.TIME_SLICING, profile, [profile])
    expected = 2 * 0.8 / slowdown
    assert expected < 0.95

    def reading() -> float:
        return next(s for s in backend.sample() if s.uuid == GPU0).sm_activity

    wait_for(lambda: abs(reading() - expected) < 1e-6, what=f"SM activity {expected:.3f}")
    sample = next(s for s in backend.sample() if s.uuid == GPU0)
    kind = gpu_type(next(d for d in backend.devices() if d.uuid == GPU0).type_name)
    draw = default_interference().power_watts(kind.idle_watts, kind.max_watts, [JobProfile(expected, 0.0)])
    assert sample.power_watts == pytest.approx(draw)
    for proc in pair:
        proc.kill()


def test_sharing_mode_comes_from_the_environment(backend: EmulatedBackend, start_job) -> None:
    job = start_job("--mem", "1GiB", "--seconds", "0.3", "--ramp", "0", env={"COLLOCATE_SHARING": "mps"})
    code, out, _ = finish(job)
    assert code == 0 and "mode mps" in out
    bad = start_job("--mem", "1GiB", "--seconds", "0.3", env={"COLLOCATE_SHARING": "fast"})
    code, _, err = finish(bad)
    assert code == 2 and "COLLOCATE_SHARING='fast'" in err and "time-slicing" in err


def test_late_peak_beyond_free_memory_crashes_mid_run(backend: EmulatedBackend, start_job) -> None:
    hog = start_job("--mem", "36GiB", "--seconds", "60", "--ramp", "0")
    wait_for(lambda: hog.pid in holders(backend, GPU0), what="the hog")
    job = start_job("--mem", "1GiB", "--peak-mem", "5GiB", "--peak-at", "0.3", "--seconds", "1", "--ramp", "0")
    code, out, err = finish(job)
    assert code == 1 and "CUDA out of memory. Tried to allocate 4.00 GiB" in err
    assert "progress" in out  # it ran for a while before the peak
    assert set(holders(backend, GPU0)) == {hog.pid}
    hog.terminate()
    finish(hog)


def test_many_concurrent_jobs_never_overcommit(backend: EmulatedBackend, start_job) -> None:
    jobs = [start_job("--mem", "10GiB", "--seconds", "60", "--ramp", "0") for _ in range(6)]
    wait_for(lambda: sum(j.poll() is not None for j in jobs) >= 3, timeout=30, what="three OOMs")
    wait_for(lambda: len(holders(backend, GPU0)) == 3, what="three holders")
    assert all(j.poll() in (None, 1) for j in jobs)
    assert sum(j.poll() == 1 for j in jobs) == 3
    for j in jobs:
        if j.poll() is None:
            j.terminate()
    assert sorted(finish(j)[0] for j in jobs) == [1, 1, 1, 143, 143, 143]
    assert holders(backend, GPU0) == {}


def test_bad_visible_devices_is_a_clear_error(backend: EmulatedBackend, start_job) -> None:
    code, _, err = finish(start_job("--mem", "1GiB", "--seconds", "1", devices="GPU-nope"))
    assert code == 2 and "not an emulated device" in err and GPU0 in err
    code, _, err = finish(start_job("--mem", "lots", "--seconds", "1"))
    assert code == 2 and "cannot read memory size 'lots'" in err


def test_missing_state_dir_is_a_clear_error(tmp_path: Path, start_job) -> None:
    code, _, err = finish(start_job("--mem", "1GiB", "--seconds", "1", "--state-dir", str(tmp_path / "x")))
    assert code == 2 and "no emulated GPU state" in err


def test_spec_validation_and_ramp_schedule() -> None:
    with pytest.raises(InputError, match="--sm"):
        JobSpec(mem_mib=1, seconds=1, sm=1.5)
    with pytest.raises(InputError, match="--peak-mem"):
        JobSpec(mem_mib=100, seconds=1, peak_mib=50)
    spec = JobSpec(mem_mib=4096, seconds=10, ramp_s=4, peak_mib=8192, peak_at=0.5, startup_s=2, warmup_s=3)
    # start-up: nothing on the GPU; then a CUDA context and a ramp in 4 steps; then the peak later
    behaviour = spec.behaviour
    assert [behaviour.mem_at(t, 0.0) for t in (0, 1.9, 2.0, 2.99, 3.0, 4.0, 5.0, 6.0, 9.0)] == \
        [None, None, 500.0, 500.0, 1024, 2048, 3072, 4096, 4096]
    assert behaviour.mem_at(9.0, 0.5) == 8192
    # training (activity shown, slowed by neighbours) starts after start-up and warm-up
    assert not behaviour.training(4.9) and behaviour.training(5.0)
    with pytest.raises(InputError, match="part of --seconds"):
        JobSpec(mem_mib=1, seconds=5, startup_s=3, warmup_s=2)


def test_torch_sizes_and_message() -> None:
    assert torch_size(20) == "20.00 MiB"
    assert torch_size(40536) == "39.59 GiB"
    assert torch_size(0) == "0 bytes"
    text = oom_message(Refusal("u", 20, 40536, 3.44, 100, ((7, 40000.0),)), 0, 1)
    assert text.startswith("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB.")
    assert "Process 7 has 39.06 GiB memory in use." in text




@pytest.mark.parametrize("mode", list(SharingMode))
def test_jobs_sharing_an_emulated_mig_instance_run_at_the_one_slowdown(state_dir: Path, start_job, mode) -> None:
    """Two real jobs on one 3g instance, time-sliced or under MPS: each trains at
    ``InterferenceModel.slowdown`` on that device, what the simulator runs them at."""
    EmulatedBackend.create(state_dir, "2xA100-40GB:mig1=3g.20gb,4g.20gb", node=NODE)
    instance = f"MIG-emu-{NODE}-1-1"
    args = ("--mem", "1GiB", "--seconds", "2", "--sm", "0.3", "--dram", "0.1", "--ramp", "0")
    pair = [start_job(*args, devices=instance, env={"COLLOCATE_SHARING": mode.value}) for _ in range(2)]
    outs = [finish(p) for p in pair]
    assert [o[0] for o in outs] == [0, 0]
    model, profile = default_interference(), JobProfile(0.3, 0.1)
    alone = model.slowdown(mode, profile, speed=42 / 98)
    shared = model.slowdown(mode, profile, [profile], speed=42 / 98)
    assert shared > alone > 1.0
    text = outs[0][1] + outs[1][1]
    assert f"slowdown {shared:.3f}" in text  # the model, applied (alone only while the other starts)
    assert set(re.findall(r"slowdown ([\d.]+)", text)) <= {f"{alone:.3f}", f"{shared:.3f}"}


def test_mps_pinned_limits_are_read_as_mib_per_ordinal():
    from collocate.node.emulate_job import pinned_limits

    assert pinned_limits("0=7578M,1=2G") == {0: 7578.0, 1: 2048.0}
    assert pinned_limits(None) == {} and pinned_limits("junk,=3M") == {}
