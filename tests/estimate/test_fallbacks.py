"""Fallbacks when fake tracing fails, and the errors when nothing can answer."""

from __future__ import annotations

import pytest

from collocate.common.errors import CollocateError
from collocate.estimate.api import estimate_memory
from collocate.estimate.cpurun import calibration_batches, estimate_cpu_run
from collocate.estimate.gpu_overheads import gpu_type
from collocate.estimate.static import TraceFailed, trace_fake


def test_item_in_forward_does_not_trace() -> None:
    with pytest.raises(TraceFailed, match="fake"):
        trace_fake("_entries:item_model", 8)


def test_cpu_run_answers_when_tracing_fails() -> None:
    est = estimate_memory("_entries:item_model", batch_size=64)
    assert est.method == "cpu-run"
    assert "fell back because traced" in est.note
    assert "extrapolated from CPU steps at batch 2 and 4" in est.note


def test_cpu_run_extrapolation_matches_trace() -> None:
    # Same model traced at batch 48 and extrapolated from real CPU steps at 2 and 4.
    traced = estimate_memory("_entries:tiny_transformer", batch_size=48)
    run = estimate_cpu_run("_entries:tiny_transformer", 48, gpu=gpu_type(None))
    assert run.mib == pytest.approx(traced.mib, rel=0.03)
    assert run.breakdown["activations"] == pytest.approx(traced.breakdown["activations"], rel=0.05)


def test_cpu_run_small_batch_is_measured_directly() -> None:
    assert calibration_batches(3) == (3,)
    est = estimate_cpu_run("_entries:item_model", 3, gpu=gpu_type(None))
    assert "measured at batch 3" in est.note


def test_batch_dependent_model_falls_through_to_analytical() -> None:
    est = estimate_memory("_entries:batch_dependent", batch_size=16)
    assert est.method == "analytical"
    assert "control flow depends on the batch" in est.note
    assert est.uncertainty > 0.3


def test_analytical_only() -> None:
    est = estimate_memory("_entries:item_model", batch_size=16, fallbacks=("analytical",))
    assert est.method == "analytical"
    # 32*8+8 params, SGD with momentum: parameters == gradients == optimizer state
    assert est.breakdown["parameters"] == est.breakdown["gradients"] == est.breakdown["optimizer_state"]


def test_analytical_allocator_share_is_the_measured_one() -> None:
    from collocate.estimate.analytical import estimate_analytical
    from collocate.estimate.gpu_overheads import RESERVED_OVER_ALLOCATED, gpu_type

    est = estimate_analytical("_entries:item_model", 1_000_000, gpu=gpu_type("H100-80GB"))
    b = est.breakdown
    tensors = b["parameters"] + b["gradients"] + b["optimizer_state"] + b["activations"]
    expected = (RESERVED_OVER_ALLOCATED - 1) * tensors
    assert b["allocator_overhead"] == pytest.approx(expected, rel=0.01)


def test_no_fallback_allowed_is_a_clear_error() -> None:
    with pytest.raises(CollocateError) as info:
        estimate_memory("_entries:item_model", batch_size=8, fallbacks=())
    assert "traced:" in str(info.value)
    assert "--mem" in str(info.value)


def test_every_method_failing_lists_each_failure() -> None:
    with pytest.raises(CollocateError) as info:
        estimate_memory("_entries:always_fails", batch_size=8)
    text = str(info.value)
    for method in ("traced:", "cpu-run:", "analytical:"):
        assert method in text
    assert "cannot run anywhere" in text and "--mem" in text


def test_unknown_fallback_name() -> None:
    with pytest.raises(CollocateError, match="unknown fallback"):
        estimate_memory("_entries:tiny_mlp", batch_size=8, fallbacks=("magic",))
