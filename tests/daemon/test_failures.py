"""Exit classification is a table: every OOM message we know, and the things that are not OOM."""

from __future__ import annotations

import pytest

from collocate.core.recovery import Outcome
from collocate.daemon.failures import classify, oom_lower_bound_mib

PYTORCH = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
           "capacity of 39.59 GiB of which 1.00 GiB is free. Including non-PyTorch memory, this process "
           "has 3.50 GiB memory in use.")


@pytest.mark.parametrize(
    ("returncode", "stderr", "outcome", "in_reason"),
    [
        (0, "step 10 loss 0.3\n", Outcome.SUCCEEDED, "exited 0"),
        (1, PYTORCH, Outcome.OOM, "CUDA out of memory"),
        (1, "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate", Outcome.OOM, "CUBLAS"),
        (1, "cudaErrorMemoryAllocation: out of memory", Outcome.OOM, "cudaErrorMemoryAllocation"),
        (1, "tensorflow.python.framework.errors_impl.ResourceExhaustedError: OOM ... RESOURCE_EXHAUSTED",
         Outcome.OOM, "RESOURCE_EXHAUSTED"),
        (1, ("jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to "
            "allocate 1.2G"), Outcome.OOM, "RESOURCE_EXHAUSTED"),
        (1, "CUDNN_STATUS_ALLOC_FAILED", Outcome.OOM, "CUDNN"),
        (-6, "terminate called after CUDA_ERROR_OUT_OF_MEMORY", Outcome.OOM, "SIGABRT"),
        # not OOM: a bug, a host-memory kill, a plain signal
        (1, "Traceback...\nKeyError: 'lr'\n", Outcome.FAILED, "KeyError: 'lr'"),
        (-9, "", Outcome.FAILED, "SIGKILL"),
        (137, "Killed\n", Outcome.FAILED, "status 137"),
        (2, "MemoryError\n", Outcome.FAILED, "MemoryError"),
        # a job that caught an OOM, lowered its batch and finished is a success
        (0, PYTORCH + "\nretrying with batch 16\n", Outcome.SUCCEEDED, "exited 0"),
        (None, "", Outcome.LOST, "vanished"),
    ],
)
def test_classify(returncode, stderr, outcome, in_reason):
    got, reason = classify(returncode, stderr)
    assert got is outcome
    assert in_reason in reason


def test_cancel_wins_over_everything():
    assert classify(1, PYTORCH, cancelled=True)[0] is Outcome.CANCELLED
    assert classify(-15, "", cancelled=True)[0] is Outcome.CANCELLED


def test_oom_lower_bound_reads_pytorchs_numbers():
    assert oom_lower_bound_mib(PYTORCH) == pytest.approx(2048 + 3584)
    assert oom_lower_bound_mib("CUDA out of memory. Tried to allocate 20.00 MiB") == pytest.approx(20)
    assert oom_lower_bound_mib("CUBLAS_STATUS_ALLOC_FAILED") is None
