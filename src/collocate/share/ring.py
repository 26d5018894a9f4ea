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

Per-batch cost is kept to the copy itself (see "Transport cost" in docs/shared-loading.md):

* The producer copies each plain contiguous CPU field with ``memmove`` (ctypes, GIL released)
  into the slot's address, not with ``Tensor.copy_``. Torch runs copies on its OpenMP team, whose
  workers spin-wait after every region and whose barrier stalls for a scheduler tick when a worker
  is preempted: on the shared 2-core box that spinning took more CPU than the copy, and a 6 MiB
  copy often took 8 ms instead of 0.5. Batches of ``PARALLEL_COPY_BYTES`` or more are shared out
  in pieces to sleeping helper threads (``_Copier``; as many threads as torch's intra-op threads,
  at most 4); below that, helpers cost more than they gain. Sizes are checked against the layout
  first; anything else (strided, conjugate, subclasses) goes through ``copy_``.
* The consumer builds each slot's field tensors once, over one storage per slot, and hands out
  fresh aliases of them (``detach``/slices). A slot is free again when that storage's use count
  and its Python object's reference count are back to what the cache alone holds: the same
  "every view is gone" test that a weak reference to a per-batch storage gives, without building
  storages per batch. It is calibrated and checked when the ring is opened; where torch lacks the
  use count (a private API) or counts differently, the reader builds storages per batch instead.
  Private copies (batches that span slots, epoch tails, ``copy=True``) are ``memmove`` too.
"""

from __future__ import annotations

import collections
import ctypes
import mmap
import os
import struct
import sys
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from collocate.share.errors import ProtocolError, RingCorruptionError, ShareError
from collocate.share.layout import Layout

_SEQ = struct.Struct("<Q")
WRITING = (1 << 64) - 1
_memmove = ctypes.memmove  # a foreign call: releases the GIL while it copies
PARALLEL_COPY_BYTES = 16 << 20  # from this batch size on, helper threads take pieces of the copy
PIECE_BYTES = 4 << 20
_PAGE = 4096


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
        self._addr = [[t.data_ptr() for t in dst] for dst in self._dst]  # valid while _map is open
        self._copier = _Copier(min(4, torch.get_num_threads()))

    def readonly_fd(self) -> int:
        """A new read-only descriptor of the ring, to pass to one consumer (caller closes it)."""
        return os.open(f"/proc/self/fd/{self.fd}", os.O_RDONLY | os.O_CLOEXEC)

    def write(self, slot: int, seq: int, tensors: list[torch.Tensor], count: int) -> None:
        """Copy a validated batch into ``slot``; the header is set last, as the commit mark."""
        base = slot * self.layout.slot_bytes
        _SEQ.pack_into(self._map, base, WRITING)
        jobs: list[tuple[int, int, int]] = []
        for field, addr, dst, src in zip(self.layout.fields, self._addr[slot], self._dst[slot], tensors, strict=True):
            nbytes = field.sample_bytes * count
            if _plain(src, nbytes):
                if nbytes:
                    jobs.append((addr, src.data_ptr(), nbytes))
            else:  # strided, conjugate, a subclass, not on the CPU...: torch knows how
                dst[:count].copy_(src)
        self._copier.copy(jobs)  # returns when all is copied; ``tensors`` keeps the sources alive
        _SEQ.pack_into(self._map, base, seq)

    def close(self) -> None:
        self._dst, self._addr = [], []
        self._copier.close()
        self._view.release()
        self._map.close()
        os.close(self.fd)


class _Copier:
    """``memmove`` byte ranges on the calling thread. A batch of ``PARALLEL_COPY_BYTES`` or more
    is cut into page-aligned pieces of about ``PIECE_BYTES`` that the caller and up to
    ``threads - 1`` helpers take from one queue: whoever is free copies the next piece, so a
    helper that is slow to wake (its core is busy) never holds the copy up, unlike a barrier.
    Helpers sleep while idle; nothing spins."""

    def __init__(self, threads: int) -> None:
        self.threads = max(1, threads)
        self._pool: ThreadPoolExecutor | None = None

    def copy(self, jobs: list[tuple[int, int, int]]) -> None:
        total = sum(n for _, _, n in jobs)
        if self.threads == 1 or total < PARALLEL_COPY_BYTES:
            _copy_all(jobs)
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.threads - 1, thread_name_prefix="share-copy")
        queue = collections.deque(_split(jobs, total, max(2, min(total // PIECE_BYTES, 16))))
        helpers = [self._pool.submit(_take_all, queue) for _ in range(self.threads - 1)]
        _take_all(queue)
        for helper in helpers:
            if not helper.cancel():  # it started: it may still be copying its last piece
                helper.result()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


def _copy_all(jobs: list[tuple[int, int, int]]) -> None:
    for dst, src, n in jobs:
        _memmove(dst, src, n)


def _take_all(queue: collections.deque[list[tuple[int, int, int]]]) -> None:
    while True:
        try:
            piece = queue.popleft()  # atomic: each piece is copied exactly once
        except IndexError:
            return
        _copy_all(piece)


def _split(jobs: list[tuple[int, int, int]], total: int, parts: int) -> list[list[tuple[int, int, int]]]:
    """Cut (dst, src, nbytes) ranges into ``parts`` lists of about equal byte counts."""
    size = -(-total // (parts * _PAGE)) * _PAGE  # page-aligned, so no two pieces share a page
    out: list[list[tuple[int, int, int]]] = [[] for _ in range(parts)]
    i, room = 0, size
    for dst, src, n in jobs:
        while n:
            if room == 0:
                i, room = i + 1, size
            take = min(n, room) if i < parts - 1 else n
            out[i].append((dst, src, take))
            dst, src, n, room = dst + take, src + take, n - take, room - take
    return out


class _SlotFence:
    """Expires once nothing but the reader's cached tensors uses one slot's storage.

    Two counts, both calibrated with only the cache alive: the storage's use count (one per
    tensor over it, including every view a script still holds) and the Python reference count of
    the storage object, which the fence keeps so that ``x.untyped_storage()`` always returns this
    very object and a script that keeps only the storage is counted too."""

    __slots__ = ("refs", "storage", "uses")

    def __init__(self, storage: torch.UntypedStorage) -> None:
        self.storage = storage
        self.uses = self.refs = -1

    def calibrate(self) -> None:
        self.uses, self.refs = torch._C._storage_Use_Count(self.storage._cdata), sys.getrefcount(self.storage)

    def expired(self) -> bool:
        return (torch._C._storage_Use_Count(self.storage._cdata) <= self.uses
                and sys.getrefcount(self.storage) <= self.refs)


class RingReader:
    """Consumer side: a read-only mapping; hands out read-only views or copies of slot rows."""

    device = torch.device("cpu")

    def __init__(self, fd: int, layout: Layout, slots: int, size: int) -> None:
        if size != segment_bytes(layout, slots):
            raise ShareError(f"ring size {size} does not match its layout", hint="restart the producer")
        self.layout, self.slots = layout, slots
        self._map = mmap.mmap(fd, size, prot=mmap.PROT_READ)
        self._view = memoryview(self._map)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            self._addr = torch.frombuffer(self._view, dtype=torch.uint8).data_ptr()  # valid while mapped
        self._cached: list[list[torch.Tensor]] = []
        self._fences: list[_SlotFence] = []
        if hasattr(torch._C, "_storage_Use_Count"):
            for slot in range(slots):
                tensors, fence = _cached_slot(self._view, slot * layout.slot_bytes, layout)
                if fence is None:  # this torch counts uses differently: build storages per batch
                    self._cached, self._fences = [], []
                    break
                self._cached.append(tensors)
                self._fences.append(fence)

    def check(self, slot: int, seq: int) -> None:
        """Raise if ``slot`` no longer holds batch ``seq`` (it was reused under us)."""
        found = _SEQ.unpack_from(self._map, slot * self.layout.slot_bytes)[0]
        if found != seq:
            raise RingCorruptionError(
                f"slot {slot} holds batch {found}, expected {seq}: it was overwritten while in use",
                hint="this only happens after the producer detached this consumer; re-create the loader",
            )

    def views(self, slot: int, lo: int, hi: int) -> list[torch.Tensor]:
        """Read-only tensors over samples [lo, hi) of ``slot``: zero copies, always new tensor objects."""
        if self._cached:
            if lo == 0 and hi == self.layout.capacity:
                return [t.detach() for t in self._cached[slot]]  # the cheapest new alias
            return [t[lo:hi] for t in self._cached[slot]]
        base = slot * self.layout.slot_bytes
        return [_tensor(self._view, base, f, self.layout.capacity)[lo:hi] for f in self.layout.fields]

    def copy(self, pieces: list[tuple[int, int, int]], out: list[torch.Tensor], at: int = 0) -> None:
        """Copy samples [lo, hi) of each (slot, lo, hi) in turn into rows ``at``... of ``out``
        (private tensors from ``layout.empty``). One ``memmove`` per piece and field (GIL
        released), so no OpenMP team wakes up and spins."""
        for slot, lo, hi in pieces:
            if not (0 <= slot < self.slots and 0 <= lo <= hi <= self.layout.capacity):
                raise ProtocolError(f"samples [{lo}, {hi}) of slot {slot} lie outside the ring")
        n = sum(hi - lo for _, lo, hi in pieces)
        if at < 0 or any(not t.is_contiguous() or len(t) < at + n for t in out):
            raise ValueError(f"rows [{at}, {at + n}) do not fit the output tensors")
        for f, t in zip(self.layout.fields, out, strict=True):
            dst = t.data_ptr() + at * f.sample_bytes
            for slot, lo, hi in pieces:
                nbytes = (hi - lo) * f.sample_bytes
                if nbytes:
                    _memmove(dst, self._addr + slot * self.layout.slot_bytes + f.offset + lo * f.sample_bytes, nbytes)
                    dst += nbytes

    def fences(self, slot: int, tensors: list[torch.Tensor]) -> list[Any]:
        """What must expire before ``slot`` (which ``tensors`` view) may be released."""
        if self._fences:
            return [self._fences[slot]]
        return [StorageWeakRef(t.untyped_storage()) for t in tensors]

    def close(self) -> None:
        """Unmap if no tensor still points into the ring; otherwise the process exit unmaps it."""
        self._cached, self._fences = [], []
        try:
            self._view.release()
            self._map.close()
        except (BufferError, ValueError):
            pass


def _plain(src: torch.Tensor, nbytes: int) -> bool:
    """A dense CPU tensor of exactly ``nbytes`` bytes, so its memory can be copied as bytes."""
    return (type(src) is torch.Tensor and src.is_cpu and src.is_contiguous() and not src.is_conj()
            and not src.is_neg() and src.nbytes == nbytes)


def _cached_slot(view: memoryview, base: int, layout: Layout) -> tuple[list[torch.Tensor], _SlotFence | None]:
    """The slot's field tensors over one storage, and the fence that tells when only they use it
    (``None`` if this torch does not count uses the way the fence expects: checked, not assumed)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # read-only buffer: the mapping protects it
        fence = _SlotFence(torch.frombuffer(view[base:base + layout.slot_bytes], dtype=torch.uint8).untyped_storage())
    tensors = []
    for f in layout.fields:
        t = torch.empty(0, dtype=f.torch_dtype)
        shape = (layout.capacity, *f.shape)
        tensors.append(t.set_(fence.storage, f.offset // t.element_size(), shape, _contiguous_strides(shape)))
    del t
    fence.calibrate()
    probe = tensors[0].narrow(0, 0, 1)
    held_view = not fence.expired()
    kept = probe.untyped_storage()
    del probe
    held_storage = not fence.expired()
    del kept
    if not (held_view and held_storage and fence.expired()):
        return tensors, None
    return tensors, fence


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(strides))


def _tensor(view: memoryview, base: int, field, capacity: int) -> torch.Tensor:
    start = base + field.offset
    nbytes = field.sample_bytes * capacity
    with warnings.catch_warnings():
        # torch warns that a read-only buffer gives a tensor it cannot protect; the mapping does.
        warnings.simplefilter("ignore", UserWarning)
        flat = torch.frombuffer(view[start:start + nbytes], dtype=torch.uint8) if nbytes else torch.empty(0, dtype=torch.uint8)
    return flat.view(field.torch_dtype).view(capacity, *field.shape)
