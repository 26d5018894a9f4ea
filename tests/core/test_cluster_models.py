"""GPU types, cluster specs, and the interference model against its published anchors."""

from pathlib import Path

import pytest

from collocate.common.errors import InputError, UnknownNameError
from collocate.core.gputypes import parse_cluster
from collocate.core.interference import default_interference
from collocate.core.model import JobProfile, SharingMode
from collocate.core.policies.risk import summarize


def test_cluster_specs():
    nodes = parse_cluster("2x(8xH100-80GB)+4xA100-40GB")
    assert [(n.name, n.count, n.gpu_type.name) for n in nodes] == [
        ("node0", 8, "H100-80GB"), ("node1", 8, "H100-80GB"), ("node2", 4, "A100-40GB")]
    with pytest.raises(UnknownNameError, match="H200-141GB"):
        parse_cluster("4xB300")
    with pytest.raises(InputError, match="2x\\(8xH100-80GB\\)"):
        parse_cluster("four GPUs")


H100_BENCH = Path(__file__).parents[2] / "benchmarks/results/bench-h100-80gb-hbm3-2026-11-22"


@pytest.mark.parametrize("mode", [SharingMode.TIME_SLICING, SharingMode.MPS])
def test_packaged_model_is_what_calibrate_fits_to_the_committed_h100_measurements(mode):
    # The numbers in data/interference.toml must come from the measurements they cite.
    from collocate.bench.calibrate import calibrate
    from collocate.bench.runner import read_results

    cal = calibrate(read_results(H100_BENCH / "results.jsonl"), source="h100")
    fitted, packaged = cal.fits[mode.value].params, default_interference().modes[mode]
    for name in ("base", "per_sm", "per_dram", "saturation_exponent"):
        assert getattr(packaged, name) == pytest.approx(getattr(fitted, name), rel=1e-3, abs=1e-4), name
    # the held-out errors --model-error draws from, too
    held_out = default_interference().held_out_log_errors[mode]
    assert held_out == pytest.approx(cal.stats[mode.value]["cv_log_ratios"], abs=1e-4)


def test_a_light_job_time_sliced_with_a_heavy_one_suffers_more_than_under_mps():
    # H100: DLRM (SM 0.30) beside a transformer (0.91) ran 3.1x slower time-sliced, 2.2x under MPS.
    model = default_interference()
    light, heavy = JobProfile(0.305, 0.221), JobProfile(0.906, 0.174)
    ts = model.slowdown(SharingMode.TIME_SLICING, light, [heavy])
    assert ts > model.slowdown(SharingMode.MPS, light, [heavy]) and ts > 1.5
    assert model.slowdown(SharingMode.TIME_SLICING, heavy, [light]) < ts


def test_small_jobs_collocated_reach_several_times_the_throughput():
    model = default_interference()
    small = JobProfile(0.2, 0.1)
    for n in (2, 3, 4):
        aggregate = n / model.slowdown(SharingMode.MPS, small, [small] * (n - 1))
        assert aggregate > 0.8 * n  # published: up to 3-4x for ResNet-26 on CIFAR-10


def test_oversubscribed_gpu_is_shared_and_alone_is_full_speed():
    model = default_interference()
    heavy = JobProfile(0.9, 0.5)
    assert model.slowdown(SharingMode.TIME_SLICING, heavy) == 1.0
    assert model.slowdown(SharingMode.TIME_SLICING, heavy, [heavy]) > 1.8


def test_risk_summary_weights_recent_peaks():
    flat = summarize([0.5] * 30)
    assert flat == pytest.approx(0.5)
    spiky = summarize([0.2] * 25 + [1.0] * 5)
    assert spiky > sum([0.2] * 25 + [1.0] * 5) / 30  # p95 and EMA pull it above the mean


def test_sharing_never_speeds_a_job_up_even_with_a_negative_fitted_base():
    import numpy as np

    from collocate.core.interference import ModeParams, shared_slowdown

    p = ModeParams(base=-0.3, per_sm=0.5, per_dram=0.5, saturation_exponent=0.0)
    assert shared_slowdown(p, 0.1, 0.05, 0.1, 0.05) == 1.0
    grid = np.linspace(0.0, 0.2, 5)
    assert np.all(shared_slowdown(p, grid, grid, grid, grid) >= 1.0)
    assert shared_slowdown(p, 0.9, 0.5, 0.9, 0.5) > 1.0
