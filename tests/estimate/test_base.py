"""The Estimate type and GPU-type lookups."""

from __future__ import annotations

import math

import pytest

from collocate.common.errors import UnknownNameError
from collocate.estimate.base import Estimate
from collocate.estimate.gpu_overheads import gpu_type, gpu_type_from_device_name


def test_estimate_validates_itself() -> None:
    with pytest.raises(ValueError, match="unknown estimate method"):
        Estimate(100.0, "guess", 0.1)
    with pytest.raises(ValueError, match="positive"):
        Estimate(0.0, "traced", 0.1)
    with pytest.raises(ValueError, match="uncertainty"):
        Estimate(10.0, "traced", -0.1)


def test_upper_bound_and_json_form() -> None:
    e = Estimate(1000.0, "traced", 0.1, {"context": 500.0, "activations": 500.0})
    assert e.upper_mib == pytest.approx(1100.0)
    assert e.to_dict()["upper_mib"] == pytest.approx(1100.0)
    none = Estimate.none("no entry point: pass --mem")
    assert not none.available and math.isinf(none.mib)
    assert none.to_dict()["mib"] is None


@pytest.mark.parametrize(
    ("device", "expected"),
    [("NVIDIA H100 80GB HBM3", "H100-80GB"), ("NVIDIA A100-SXM4-40GB", "A100-40GB"),
     ("NVIDIA A100 80GB PCIe", "A100-80GB"), ("NVIDIA H200", "H200-141GB"),
     ("NVIDIA GeForce RTX 3090", None)],
)
def test_device_names_map_to_gpu_types(device: str, expected: str | None) -> None:
    g = gpu_type_from_device_name(device)
    assert (g.name if g else None) == expected


def test_gpu_type_lookup_is_case_insensitive_and_lists_valid() -> None:
    assert gpu_type("h100-80gb").name == "H100-80GB"
    with pytest.raises(UnknownNameError) as info:
        gpu_type("TPUv4")
    assert "A100-40GB" in info.value.valid
