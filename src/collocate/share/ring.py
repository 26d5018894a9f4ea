"""The CPU ring: ``slots`` fixed-size slots in one anonymous shared-memory file (memfd).

The producer creates the memfd, reserves its pages up front (so a too-small ``/dev/shm`` or
memory cgroup fails now with a clear error instead of SIGBUS later) and hands consumers a
*read-only* descriptor to it over the control socket. Consumers map it ``PROT_READ``: a tensor
view into a slot cannot be written, so one consumer's in-place op can never corrupt another's
batch (the writer gets SIGSEGV instead). The memfd has no name, so no exit path can leak it:
its pages are freed when the last process that maps it exits.

Slot layout: a 64-byte header whose first 8 bytes hold the sequence number of the batch in the
slot (written *after* the data; all-ones while a write is in progress), then one array per
field, ``capacity`` samples long, 64-byte aligned. Consumers compare the header with the
sequence number they were told, which catches any overwrite of a slot still in use.
"""

from __future__ import annotations

import mmap
import os
import struct
import warnings

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from collocate.share.errors import RingCorruptionError, ShareError
from collocate.share.layout import Layout

_SEQ = struct.Struct("<Q")
WRITING = (1 << 64) - 1


def segment_bytes(layout: Layout, slots: int) -> int:
    return layout.slot_bytes * slots


class RingWriter:
    """Producer side: owns the memfd and a writable mapping; copies batches into slots."""

    backend = "cpu"

    def __init__(self, layout: Layout, slots: int) -> None:
        self.layout, self.slots = layout, slots
        size = segment_bytes(layout, slots)
        self.fd = os.memfd_create("collocate-share-ring", os.MFD_CLOEXEC)
        try:
            os.ftruncate(self.fd, size)
            os.posix_fallocate(self.fd, 0, size)
        except OSError as exc:
            os.close(self.fd)
            raise ShareError(
                f"cannot reserve {size / 2**20:.1f} MiB of shared memory for {slots} slots of "
                f"{layout.slot_bytes / 2**20:.2f} MiB: {exc}",
                hint="lower slots=, use smaller batches, or give the container more shared memory "
                "(docker --shm-size or --ipc=host)",
            ) from None
        self._map = mmap.mmap(self.fd, size)
        self._view = memoryview(self._map)
        self._dst: list[list[torch.Tensor]] = [
            [_tensor(self._view, slot * layout.slot_bytes, f, layout.capacity) for f in layout.fields]
            for slot in range(slots)
        ]

    def readonly_fd(self) -> int:
        """A new read-only descriptor of the ring, to pass to one consumer (caller closes it)."""
        return os.open(f"/proc/self/fd/{self.fd}", os.O_RDONLY | os.O_CLOEXEC)

    def write(self, slot: int, seq: int, tensors: list[torch.Tensor], count: int) -> None:
        """Copy a validated batch into ``slot``; the header is set last, as the commit mark."""
        base = slot * self.layout.slot_bytes
        _SEQ.pack_into(self._map, base, WRITING)
        for dst, src in zip(self._dst[slot], tensors):
            dst[:count].copy_(src)
        _SEQ.pack_into(self._map, base, seq)

    def close(self) -> None:
        self._dst = []
        self._view.release()
        self._map.close()
        os.close(self.fd)


class RingReader:
    """Consumer side: a read-only mapping; hands out read-only views or copies of slot rows."""

    def __init__(self, fd: int, layout: Layout, slots: int, size: int) -> None:
        if size != segment_bytes(layout, slots):
            raise ShareError(f"ring size {size} does not match its layout", hint="restart the producer")
        self.layout, self.slots = layout, slots
        self._map = mmap.mmap(fd, size, prot=mmap.PROT_READ)
        self._view = memoryview(self._map)

    def check(self, slot: int, seq: int) -> None:
        """Raise if ``slot`` no longer holds batch ``seq`` (it was reused under us)."""
        found = _SEQ.unpack_from(self._map, slot * self.layout.slot_bytes)[0]
        if found != seq:
            raise RingCorruptionError(
                f"slot {slot} holds batch {found}, expected {seq}: it was overwritten while in use",
                hint="this only happens after the producer detached this consumer; re-create the loader",
            )

    def views(self, slot: int, lo: int, hi: int) -> list[torch.Tensor]:
        """Read-only tensors over samples [lo, hi) of ``slot``: zero copies."""
        base = slot * self.layout.slot_bytes
        return [_tensor(self._view, base, f, self.layout.capacity)[lo:hi] for f in self.layout.fields]

    def fences(self, tensors: list[torch.Tensor]) -> list[StorageWeakRef]:
        """What must expire before the slot behind ``tensors`` may be released."""
        return [StorageWeakRef(t.untyped_storage()) for t in tensors]

    def close(self) -> None:
        """Unmap if no tensor still points into the ring; otherwise the process exit unmaps it."""
        try:
            self._view.release()
            self._map.close()
        except (BufferError, ValueError):
            pass


def _tensor(view: memoryview, base: int, field, capacity: int) -> torch.Tensor:
    start = base + field.offset
    nbytes = field.sample_bytes * capacity
    with warnings.catch_warnings():
        # torch warns that a read-only buffer gives a tensor it cannot protect; the mapping does.
        warnings.simplefilter("ignore", UserWarning)
        flat = torch.frombuffer(view[start:start + nbytes], dtype=torch.uint8) if nbytes else torch.empty(0, dtype=torch.uint8)
    return flat.view(field.torch_dtype).view(capacity, *field.shape)
