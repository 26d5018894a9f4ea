"""Memory a training process uses on a GPU besides its tensors, per GPU type.

Four parts, with where each number comes from. ``benchmarks/gpu/estimator_ground_truth.py``
records NVML per-process memory and ``torch.cuda.max_memory_reserved`` side by side; the
difference is exactly the context.

* **CUDA context** (driver state, PyTorch's and cuDNN/cuBLAS kernel images, not visible to
  ``torch.cuda.memory_reserved``). **Hopper: measured** on an H100 80GB HBM3 (driver 580.159.04,
  CUDA 13.0, torch 2.11.0+cu130, 2026-11-23): 742-762 MiB over 48 training processes (median
  758; ``benchmarks/results/estimator_ground_truth-h100-80gb-hbm3-2026-11-23.csv``). We take
  760 MiB ±100 MiB (other driver and torch versions load other kernel images). **Older GPUs:
  not measured**; with lazy module loading public reports put it at 300-600 MiB, and we take
  500 MiB ±200 MiB.
* **cuBLAS workspace**: PyTorch allocates it through the caching allocator, once per
  (handle, stream). Its default size, read from ``aten/src/ATen/cuda/CublasHandlePool.cpp``, is
  ``4096*8*1024`` bytes (32 MiB) on sm90 and ``4096*1024*2 + 16*1024*8`` bytes (about 8.1 MiB)
  otherwise; recent PyTorch shares it with cuBLASLt. A training step uses two handles: one on the
  main thread (forward) and one on the autograd engine's device thread (backward). These are
  injected into the allocation timeline, so the allocator model rounds them like any tensor.
* **cuDNN convolution workspace**: transient, algorithm-dependent, also from the caching
  allocator. Heuristic allowance: as large as the largest convolution tensor of the step, capped
  at 1 GiB, with ±100% uncertainty. Placeholder until measured.
* **Caching-allocator slack, at least** ``RESERVED_OVER_ALLOCATED``: on the GPU, torch's reserved
  peak was 1.03-1.74x its allocated peak (median 1.14) over the same 48 H100 processes. Replaying
  the CPU trace through ``allocator.py`` reproduces the allocated peak (0.87-1.10x, median 1.01,
  for the built-in models) but not that slack: it modelled 15-1,260 MiB where 16-2,205 MiB were
  measured, because the GPU's order of allocations (cuDNN workspaces, the autograd thread) is not
  the CPU trace's. So the estimate takes the larger of the replayed slack and 14% of the
  allocated bytes.

  With ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` (``ALLOCATORS``' "expandable") the
  slack nearly vanishes: reserved was 1.02-1.07x allocated (median 1.03) for four CNNs whose
  default-mode slack was 1.20-1.74x, with the same allocated peak (H100, cuDNN 9.19,
  ``benchmarks/results/allocator_probe-h100-80gb-hbm3-2026-11-23.json``). The floor there is 3%;
  four configurations are few, so this is a first measurement, not a fit.
"""

from __future__ import annotations

from dataclasses import dataclass

from collocate.core import gputypes

MIB = 1 << 20
CUBLAS_WS_SM90 = 4096 * 8 * 1024
CUBLAS_WS_DEFAULT = 4096 * 1024 * 2 + 16 * 1024 * 8
CUBLAS_HANDLES_PER_STEP = 2
CUDNN_WS_CAP = 1 << 30
RESERVED_OVER_ALLOCATED = 1.14  # measured median, H100 + torch 2.11 (module docstring)
EXPANDABLE_RESERVED_OVER_ALLOCATED = 1.03  # the same with expandable segments (4 CNNs)
#: PyTorch's CUDA allocator modes the estimator models (``PYTORCH_CUDA_ALLOC_CONF``).
ALLOCATORS = ("default", "expandable")


def allocator_from_conf(conf: str | None) -> str:
    """The allocator mode a ``PYTORCH_CUDA_ALLOC_CONF`` value selects.

    The value is comma-separated ``key:value`` pairs; PyTorch reads ``expandable_segments``
    as true when its value is ``True`` (any case).
    """
    for item in (conf or "").split(","):
        key, _, value = item.partition(":")
        if key.strip() == "expandable_segments" and value.strip().lower() == "true":
            return "expandable"
    return "default"


def reserved_over_allocated(allocator: str) -> float:
    """The measured floor on reserved / allocated for an allocator mode."""
    return EXPANDABLE_RESERVED_OVER_ALLOCATED if allocator == "expandable" else RESERVED_OVER_ALLOCATED


@dataclass(frozen=True)
class GpuType:
    """One GPU model as the estimator needs it: capacity, compute capability, context size."""

    name: str
    total_mib: int
    sm: int  # compute capability, e.g. 90 for Hopper
    context_mib: float
    context_uncertainty_mib: float

    @property
    def cublas_workspace_bytes(self) -> int:
        return CUBLAS_WS_SM90 if self.sm >= 90 else CUBLAS_WS_DEFAULT


def _overheads(t: gputypes.GpuType) -> GpuType:
    # Context sizes (see the module docstring): measured on Hopper, a placeholder before it.
    if t.compute_capability >= 90:
        return GpuType(t.name, t.memory_mib, t.compute_capability, 760.0, 100.0)
    return GpuType(t.name, t.memory_mib, t.compute_capability, 500.0, 200.0)


# The GPU types are collocate.core.gputypes' (one table for the scheduler, simulator and estimator).
GPU_TYPES: dict[str, GpuType] = {name: _overheads(t) for name, t in gputypes.GPU_TYPES.items()}

DEFAULT_GPU = "A100-80GB"


def gpu_type(name: str | None) -> GpuType:
    """Look a GPU type up by name (case-insensitive); the error lists the known ones."""
    if name is None:
        return GPU_TYPES[DEFAULT_GPU]
    return GPU_TYPES[gputypes.gpu_type(name).name]


def cudnn_workspace_bytes(largest_conv_bytes: int) -> int:
    """Heuristic cuDNN workspace allowance for a step whose largest conv tensor is given."""
    return min(largest_conv_bytes, CUDNN_WS_CAP)


def gpu_type_from_device_name(device_name: str) -> GpuType | None:
    """Map an NVML/CUDA device name ("NVIDIA H100 80GB HBM3") to a known type, or None."""
    return GPU_TYPES.get(gputypes.type_name_from_product(device_name))
