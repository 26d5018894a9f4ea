"""A pure model of PyTorch's CUDA caching allocator (the default, non-expandable mode).

Why: what other processes on a GPU see is the memory the caching allocator has *reserved*
from CUDA (``torch.cuda.max_memory_reserved``), not the bytes live tensors occupy. Rounding,
pool segments and fragmentation add 5-30% on top of the live bytes, so a tracer that stops at
live bytes (as CARMA's FakeTensor estimator did) under-estimates. We replay a recorded
allocation/free timeline through this model to get the reserved peak.

Constants and rules follow ``c10/cuda/CUDACachingAllocator.cpp`` (read, not copied):

* every request is rounded up to a multiple of 512 bytes (``kMinBlockSize``);
* requests of at most 1 MiB (``kSmallSize``) come from the *small pool*, whose segments are
  2 MiB (``kSmallBuffer``);
* larger requests come from the *large pool*: below 10 MiB (``kMinLargeAlloc``) a new segment is
  20 MiB (``kLargeBuffer``); from 10 MiB up it is the request rounded up to 2 MiB
  (``kRoundLarge``);
* a cached free block is chosen best-fit (smallest block that is large enough, lowest address
  on ties) within the request's pool;
* a chosen block is split when the remainder is at least 512 bytes (small pool) or more than
  1 MiB (large pool); otherwise the whole block is handed out;
* freed blocks merge with free neighbours of the same segment; segments are never returned to
  CUDA unless an allocation would exceed the device (then all fully free segments are released
  and the allocation retried, like ``release_cached_blocks``).

Not modelled: multiple streams, ``max_split_size_mb``, ``expandable_segments``, garbage
collection thresholds, and CUDA graphs' private pools.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass

MIN_BLOCK_SIZE = 512
SMALL_SIZE = 1 << 20  # 1 MiB
SMALL_BUFFER = 2 << 20  # 2 MiB
LARGE_BUFFER = 20 << 20  # 20 MiB
MIN_LARGE_ALLOC = 10 << 20  # 10 MiB
ROUND_LARGE = 2 << 20  # 2 MiB


def round_size(nbytes: int) -> int:
    """Bytes the allocator actually hands out for a request of ``nbytes``."""
    if nbytes < MIN_BLOCK_SIZE:
        return MIN_BLOCK_SIZE
    return MIN_BLOCK_SIZE * ((nbytes + MIN_BLOCK_SIZE - 1) // MIN_BLOCK_SIZE)


def is_small(rounded: int) -> bool:
    """Whether a rounded request is served from the small pool."""
    return rounded <= SMALL_SIZE


def segment_size(rounded: int) -> int:
    """Size of the new segment ``cudaMalloc``-ed when no cached block fits."""
    if rounded <= SMALL_SIZE:
        return SMALL_BUFFER
    if rounded < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return ROUND_LARGE * ((rounded + ROUND_LARGE - 1) // ROUND_LARGE)


def should_split(block_size: int, rounded: int) -> bool:
    """Whether a cached block of ``block_size`` is split to serve ``rounded`` bytes."""
    remaining = block_size - rounded
    if is_small(rounded):
        return remaining >= MIN_BLOCK_SIZE
    return remaining > SMALL_SIZE


@dataclass(frozen=True)
class Alloc:
    """One allocation event: storage ``key`` of ``nbytes`` comes alive."""

    key: int
    nbytes: int


@dataclass(frozen=True)
class Free:
    """One free event: storage ``key`` dies."""

    key: int


Event = Alloc | Free


@dataclass
class _Block:
    segment: int
    offset: int
    size: int
    free: bool
    small: bool


@dataclass
class ReplayResult:
    """Outcome of replaying a timeline: peaks in bytes and where they happened."""

    peak_allocated: int
    peak_reserved: int
    peak_allocated_index: int
    final_allocated: int
    final_reserved: int
    segments: int
    oom: bool = False
    reserved_at_peak_allocated: int = 0
    live_requested_at_peak: int = 0


class _State:
    """Mutable allocator state; only ``replay`` drives it, so the module stays pure outside."""

    def __init__(self, capacity: int | None) -> None:
        self.capacity = capacity
        self.blocks: dict[tuple[int, int], _Block] = {}  # (segment, offset) -> block
        self.ends: dict[tuple[int, int], _Block] = {}  # (segment, end offset) -> block
        self.seg_sizes: dict[int, int] = {}
        self.free_small: list[tuple[int, int, int]] = []  # sorted (size, segment, offset)
        self.free_large: list[tuple[int, int, int]] = []
        self.next_segment = 0
        self.reserved = 0
        self.allocated = 0
        self.oom = False

    def _put(self, b: _Block) -> None:
        self.blocks[(b.segment, b.offset)] = b
        self.ends[(b.segment, b.offset + b.size)] = b

    def _drop(self, b: _Block) -> None:
        del self.blocks[(b.segment, b.offset)]
        del self.ends[(b.segment, b.offset + b.size)]

    def _pool(self, small: bool) -> list[tuple[int, int, int]]:
        return self.free_small if small else self.free_large

    def _add_free(self, b: _Block) -> None:
        b.free = True
        bisect.insort(self._pool(b.small), (b.size, b.segment, b.offset))

    def _remove_free(self, b: _Block) -> None:
        pool = self._pool(b.small)
        del pool[bisect.bisect_left(pool, (b.size, b.segment, b.offset))]
        b.free = False

    def _new_segment(self, size: int, small: bool) -> _Block:
        if self.capacity is not None and self.reserved + size > self.capacity:
            self._release_free_segments()
            if self.reserved + size > self.capacity:
                self.oom = True
        seg = self.next_segment
        self.next_segment += 1
        self.seg_sizes[seg] = size
        self.reserved += size
        b = _Block(seg, 0, size, False, small)
        self._put(b)
        return b

    def _release_free_segments(self) -> None:
        for seg, size in list(self.seg_sizes.items()):
            b = self.blocks.get((seg, 0))
            if b is not None and b.free and b.size == size:
                self._remove_free(b)
                self._drop(b)
                del self.seg_sizes[seg]
                self.reserved -= size

    def malloc(self, nbytes: int) -> tuple[int, int]:
        rounded = round_size(nbytes)
        small = is_small(rounded)
        pool = self._pool(small)
        i = bisect.bisect_left(pool, (rounded, -1, -1))
        if i < len(pool):
            _, seg, off = pool[i]
            b = self.blocks[(seg, off)]
            self._remove_free(b)
        else:
            b = self._new_segment(segment_size(rounded), small)
        if should_split(b.size, rounded):
            self._drop(b)
            rest = _Block(b.segment, b.offset + rounded, b.size - rounded, True, small)
            b.size = rounded
            self._put(b)
            self._put(rest)
            self._add_free(rest)
        self.allocated += b.size
        return b.segment, b.offset

    def free(self, where: tuple[int, int]) -> None:
        b = self.blocks[where]
        self.allocated -= b.size
        nxt = self.blocks.get((b.segment, b.offset + b.size))
        if nxt is not None and nxt.free:
            self._remove_free(nxt)
            self._drop(nxt)
            self._drop(b)
            b.size += nxt.size
            self._put(b)
        prev = self.ends.get((b.segment, b.offset))
        if prev is not None and prev.free:
            self._remove_free(prev)
            self._drop(prev)
            self._drop(b)
            prev.size += b.size
            self._put(prev)
            b = prev
        self._add_free(b)


def replay(events: Iterable[Event], *, capacity_bytes: int | None = None) -> ReplayResult:
    """Replay ``events`` through the allocator model and return its peaks.

    Frees of keys never allocated are ignored (a tracer may see a tensor die that was born
    before it started); keys still alive at the end simply stay allocated.
    """
    st = _State(capacity_bytes)
    where: dict[int, tuple[int, int]] = {}
    requested: dict[int, int] = {}
    live_req = 0
    peak_alloc = peak_res = 0
    peak_idx = -1
    res_at_peak = req_at_peak = 0
    for i, ev in enumerate(events):
        if isinstance(ev, Alloc):
            if ev.key in where:
                continue
            where[ev.key] = st.malloc(ev.nbytes)
            requested[ev.key] = ev.nbytes
            live_req += ev.nbytes
            if st.allocated > peak_alloc:
                peak_alloc, peak_idx = st.allocated, i
                res_at_peak, req_at_peak = st.reserved, live_req
            peak_res = max(peak_res, st.reserved)
        else:
            loc = where.pop(ev.key, None)
            if loc is not None:
                st.free(loc)
                live_req -= requested.pop(ev.key)
    return ReplayResult(
        peak_allocated=peak_alloc,
        peak_reserved=peak_res,
        peak_allocated_index=peak_idx,
        final_allocated=st.allocated,
        final_reserved=st.reserved,
        segments=len(st.seg_sizes),
        oom=st.oom,
        reserved_at_peak_allocated=res_at_peak,
        live_requested_at_peak=req_at_peak,
    )
