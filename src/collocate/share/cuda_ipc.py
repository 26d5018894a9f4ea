"""The CUDA ring: slots in producer GPU memory, shared with consumers through CUDA IPC.

STATUS: written against torch's documented IPC reductions but NOT YET RUN ON A GPU (the
development machine is CPU-only). ``benchmarks/gpu/share_gpu.py`` exercises it; treat this
backend as experimental until that script has passed on a real GPU.

Design, following the TensorSocket notes: each slot is its own allocation, exported with
``UntypedStorage._share_cuda_()`` once per consumer when it connects; consumers open every
handle once (``_new_shared_cuda``), so per batch only the slot index crosses the socket and torch's
per-share bookkeeping (ref-counter files, IPC events) does not grow with the number of batches.
The producer synchronises its stream after filling a slot and before publishing it, so a
consumer never reads a half-written slot. A consumer releases a slot only after (a) all tensors
it handed out from it are gone (weak references to a per-batch DLPack alias of the slot) and
(b) a CUDA event recorded on its stream after that point has completed, so kernels still queued
on the batch finish before the producer may overwrite it. Unlike the CPU ring, views are not
write-protected (CUDA IPC maps memory read-write): use ``copy=True`` for isolation.
"""

from __future__ import annotations

import base64
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from collocate.share.errors import ShareError
from collocate.share.layout import Layout


def _b64(value: Any) -> Any:
    return {"b64": base64.b64encode(value).decode()} if isinstance(value, (bytes, bytearray)) else value


def _unb64(value: Any) -> Any:
    return base64.b64decode(value["b64"]) if isinstance(value, dict) and "b64" in value else value


class CudaRingWriter:
    """Producer side: ``slots`` device buffers, each exported through CUDA IPC exactly once."""

    backend = "cuda"

    def __init__(self, layout: Layout, slots: int, device: str) -> None:
        if not torch.cuda.is_available():
            raise ShareError(f"device={device!r} needs CUDA, but torch sees no GPU",
                             hint="use device='cpu' (the shared-memory ring) on this machine")
        self.layout, self.slots = layout, slots
        self.device = torch.device(device)
        self._buffers = [torch.empty(layout.slot_bytes, dtype=torch.uint8, device=self.device) for _ in range(slots)]
        self._dst = [[_field_view(buf, f, layout.capacity) for f in layout.fields] for buf in self._buffers]

    def handles(self) -> list[list[Any]]:
        """JSON-safe IPC handles, one per slot (bytes as base64), exported for one consumer at WELCOME.

        Exporting per consumer (not once for all) keeps torch's cross-process reference counter
        balanced: each ``_share_cuda_`` adds one reference that exactly one receiver releases.
        """
        return [[_b64(v) for v in buf.untyped_storage()._share_cuda_()] for buf in self._buffers]

    def write(self, slot: int, seq: int, tensors: list[torch.Tensor], count: int) -> None:
        for dst, src in zip(self._dst[slot], tensors, strict=True):
            dst[:count].copy_(src, non_blocking=True)
        torch.cuda.current_stream(self.device).synchronize()

    def close(self) -> None:
        self._dst, self._buffers = [], []


class _CudaFence:
    """Expires once the batch's tensors are gone *and* the GPU work queued before that has run."""

    def __init__(self, refs: list[StorageWeakRef], stream: torch.cuda.Stream) -> None:
        self.refs, self.stream = refs, stream
        self.event: torch.cuda.Event | None = None

    def expired(self) -> bool:
        if self.event is None:
            if not all(r.expired() for r in self.refs):
                return False
            self.event = torch.cuda.Event()
            self.event.record(self.stream)
        return bool(self.event.query())


class CudaRingReader:
    """Consumer side: opens each slot's IPC handle once and hands out per-batch aliases."""

    def __init__(self, handles: list[list[Any]], layout: Layout, slots: int) -> None:
        if len(handles) != slots:
            raise ShareError(f"producer sent {len(handles)} CUDA handles for {slots} slots", hint="restart the producer")
        torch.cuda.init()
        self.layout, self.slots = layout, slots
        self._buffers = []
        for handle in handles:
            args = [_unb64(v) for v in handle]
            storage = torch.UntypedStorage._new_shared_cuda(*args)
            self._buffers.append(torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage))
        self.device = self._buffers[0].device

    def check(self, slot: int, seq: int) -> None:
        """No header check on the GPU path (it would cost a device sync per batch)."""

    def views(self, slot: int, lo: int, hi: int) -> list[torch.Tensor]:
        alias = torch.from_dlpack(self._buffers[slot])  # a new storage per batch, for release tracking
        return [_field_view(alias, f, self.layout.capacity)[lo:hi] for f in self.layout.fields]

    def copy(self, pieces: list[tuple[int, int, int]], out: list[torch.Tensor], at: int = 0) -> None:
        """Copy samples [lo, hi) of each (slot, lo, hi) in turn into rows ``at``... of ``out``."""
        for slot, lo, hi in pieces:
            for dst, src in zip(out, self.views(slot, lo, hi), strict=True):
                dst[at:at + hi - lo].copy_(src)
            at += hi - lo

    def fences(self, slot: int, tensors: list[torch.Tensor]) -> list[Any]:
        refs = [StorageWeakRef(t.untyped_storage()) for t in tensors]
        return [_CudaFence(refs, torch.cuda.current_stream(self.device))]

    def close(self) -> None:
        self._buffers = []


def _field_view(buf: torch.Tensor, field: Any, capacity: int) -> torch.Tensor:
    nbytes = field.sample_bytes * capacity
    return buf[field.offset:field.offset + nbytes].view(field.torch_dtype).view(capacity, *field.shape)
