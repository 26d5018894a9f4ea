"""GPU types, cluster specs, and the interference model against its published anchors."""

import pytest

from collocate.errors import InputError, UnknownNameError
from collocate.gputypes import parse_cluster
from collocate.interference import default_interference
from collocate.model import JobProfile, SharingMode
from collocate.policies.risk import summarize


def test_cluster_specs():
    nodes = parse_cluster("2x(8xH100-80GB)+4xA100-40GB")
    assert [(n.name, n.count, n.gpu_type.name) for n in nodes] == [
        ("node0", 8, "H100-80GB"), ("node1", 8, "H100-80GB"), ("node2", 4, "A100-40GB")]
    with pytest.raises(UnknownNameError, match="H200-141GB"):
        parse_cluster("4xB300")
    with pytest.raises(InputError, match="2x\\(8xH100-80GB\\)"):
        parse_cluster("four GPUs")


@pytest.mark.parametrize(
    "mode, resnet_pct, dlrm_pct",
    [(SharingMode.MPS, 4, 5), (SharingMode.TIME_SLICING, 5, 14)],
)
def test_interference_reproduces_the_published_anchor_pair(mode, resnet_pct, dlrm_pct):
    # ResNet-152 (SM 0.82) with DLRM (0.05) on an A100; DRAM activity assumed low for both.
    model = default_interference()
    resnet, dlrm = JobProfile(0.82, 0.0), JobProfile(0.05, 0.0)
    assert (model.slowdown(mode, resnet, [dlrm]) - 1) * 100 == pytest.approx(resnet_pct, abs=0.5)
    assert (model.slowdown(mode, dlrm, [resnet]) - 1) * 100 == pytest.approx(dlrm_pct, abs=0.5)


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
