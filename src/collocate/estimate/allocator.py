"""A pure model of PyTorch's CUDA caching allocator, default mode and expandable segments.

Why: what other processes on a GPU see is the memory the caching allocator has *reserved*
from CUDA (``torch.cuda.max_memory_reserved``), not the bytes live tensors occupy. Rounding,
pool segments and fragmentation add 5-30% on top of the live bytes, so a tracer that stops at
live bytes (as CARMA's FakeTensor estimator did) under-estimates. We replay a recorded
allocation/free timeline through this model to get the reserved peak.

Constants and rules follow ``c10/cuda/CUDACachingAllocator.cpp`` (read, not copied).

Default mode (``DeviceCachingAllocator::malloc`` -> ``get_free_block`` -> ``alloc_block``):

* every request is rounded up to a multiple of 512 bytes (``round_size``, ``kMinBlockSize``);
* requests of at most 1 MiB (``kSmallSize``) come from the *small pool*, whose segments are
  2 MiB (``kSmallBuffer``);
* larger requests come from the *large pool*: below 10 MiB (``kMinLargeAlloc``) a new segment is
  20 MiB (``kLargeBuffer``); from 10 MiB up it is the request rounded up to 2 MiB
  (``kRoundLarge``) (``get_allocation_size``);
* a cached free block is chosen best-fit (smallest block that is large enough, lowest address
  on ties) within the request's pool (``get_free_block``);
* a chosen block is split when the remainder is at least 512 bytes (small pool) or more than
  1 MiB (large pool); otherwise the whole block is handed out (``should_split``);
* freed blocks merge with free neighbours of the same segment (``free_block``,
  ``try_merge_blocks``); segments are never returned to CUDA unless an allocation would exceed
  the device (then all fully free segments are released and the allocation retried, like
  ``release_cached_blocks`` -> ``release_blocks``).

Expandable segments (``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``; Note [Expandable
Segments]): instead of one ``cudaMalloc`` per segment, each pool (per stream; we model one
stream) owns one ``ExpandableSegment``, a huge virtual address range of which only a prefix is
backed by physical pages (``cuMemCreate``/``cuMemMap``). Why it matters: freed memory at the end
of the range is *extended* instead of being stranded next to a brand new segment, so reserved
stays close to allocated (measured on an H100: reserved 1.02-1.07x allocated, against 1.2-1.74x
in default mode). The rules:

* the page (``ExpandableSegment::segment_size_``) is 2 MiB for the small pool (``kSmallBuffer``)
  and 20 MiB for the large pool (``large_segment_size()``, default ``kLargeBuffer``), chosen in
  ``find_expandable_block``; allocator traces show ``segment_map`` events in exactly those
  multiples. Rounding and the pool choice are unchanged (512 bytes, ``kSmallSize``);
* ``get_free_block`` is still best-fit, but ranks an expandable block by the size it could grow
  to (its size plus an unmapped range right after it): from the best fit it walks to larger
  blocks while their growable size is smaller. So the free block at the mapped end of the
  range (followed by the unmapped rest, effectively unbounded) is used only when no other free
  block fits, and stays available for growing;
* when no free block fits, ``alloc_block`` calls ``try_allocate_expandable_block``:
  ``find_expandable_block`` takes the lowest-address unmapped range, starting at the free mapped
  block just before it if there is one, whose chain of free/unmapped address space can hold
  the request; ``map_block`` then maps only the missing bytes, rounded up to whole pages
  (``ExpandableSegment::map``), and merges the new pages with that free block (and with a free
  block after them when they fill a hole);
* in expandable mode ``should_split`` splits *every* pool's block when the remainder is at least
  512 bytes, so a block handed out is exactly the rounded request (large blocks are no longer
  handed out whole with up to 1 MiB unsplit);
* freed memory stays mapped (reserved) until ``empty_cache`` or an OOM retry; then
  ``release_blocks`` calls ``unmap_block`` on every free block, which unmaps the whole pages
  inside it (``ExpandableSegment::unmap``), leaving the partial-page ends as free blocks; the
  unmapped ranges become holes that ``find_expandable_block`` fills before the end of the
  range (lowest address first). A segment left with nothing mapped is released
  (``release_expandable_segment``).

Reserved bytes in expandable mode are the mapped bytes, summed over the pools.

Capacity (``capacity_bytes``) stands for the device's memory: growing (a new segment, or new
pages) beyond it first releases cached memory as above and retries; if that still does not fit
the replay flags ``oom`` and goes on as if the memory were there.

Not modelled: multiple streams, ``max_split_size_mb``, ``roundup_power2_divisions``, garbage
collection thresholds, CUDA graphs' private pools, ``per_process_memory_fraction`` (whose check
in ``alloc_block`` uses ``get_allocation_size`` even in expandable mode, while we check the pages
actually mapped), and the finite virtual range of an expandable segment (1 1/8 of the device's
memory, ``max_handles_``): we treat it as unbounded, so there is never more than one segment per
pool, and the unmapped end always ranks as the largest growable size.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

MIN_BLOCK_SIZE = 512
SMALL_SIZE = 1 << 20  # 1 MiB
SMALL_BUFFER = 2 << 20  # 2 MiB
LARGE_BUFFER = 20 << 20  # 20 MiB
MIN_LARGE_ALLOC = 10 << 20  # 10 MiB
ROUND_LARGE = 2 << 20  # 2 MiB
SMALL_PAGE = SMALL_BUFFER  # expandable segments: page of the small pool
LARGE_PAGE = LARGE_BUFFER  # expandable segments: page of the large pool


def round_size(nbytes: int) -> int:
    """Bytes the allocator actually hands out for a request of ``nbytes``."""
    if nbytes < MIN_BLOCK_SIZE:
        return MIN_BLOCK_SIZE
    return MIN_BLOCK_SIZE * ((nbytes + MIN_BLOCK_SIZE - 1) // MIN_BLOCK_SIZE)


def is_small(rounded: int) -> bool:
    """Whether a rounded request is served from the small pool."""
    return rounded <= SMALL_SIZE


def segment_size(rounded: int) -> int:
    """Size of the new segment ``cudaMalloc``-ed when no cached block fits (default mode)."""
    if rounded <= SMALL_SIZE:
        return SMALL_BUFFER
    if rounded < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return ROUND_LARGE * ((rounded + ROUND_LARGE - 1) // ROUND_LARGE)


def page_size(small: bool) -> int:
    """Granularity in which an expandable segment of the small or large pool maps memory."""
    return SMALL_PAGE if small else LARGE_PAGE


def should_split(block_size: int, rounded: int, expandable: bool = False) -> bool:
    """Whether a cached block of ``block_size`` is split to serve ``rounded`` bytes.

    Large blocks keep up to 1 MiB of slack in default mode (splitting off slivers would only
    fragment a segment that cannot grow); with expandable segments every remainder of at least
    512 bytes is split off.
    """
    remaining = block_size - rounded
    if is_small(rounded) or expandable:
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
    """A mapped piece of a segment, allocated or free (unmapped ranges are not blocks)."""

    segment: int
    offset: int
    size: int
    free: bool
    small: bool


@dataclass
class ReplayResult:
    """Outcome of replaying a timeline: peaks in bytes and where they happened.

    ``segments`` is the number of segments held at the end: ``cudaMalloc``-ed segments in
    default mode; with expandable segments, the number of expandable segments in use (one per
    pool that has memory mapped, so at most 2). The per-pool peaks correspond to
    ``torch.cuda.memory_stats()``'s ``reserved_bytes.{small,large}_pool.peak``.
    """

    peak_allocated: int
    peak_reserved: int
    peak_allocated_index: int
    final_allocated: int
    final_reserved: int
    segments: int
    oom: bool = False
    reserved_at_peak_allocated: int = 0
    live_requested_at_peak: int = 0
    peak_reserved_small_pool: int = 0
    peak_reserved_large_pool: int = 0


@dataclass
class _Expandable:
    """The address space of one pool's expandable segment: which ranges are mapped.

    Offsets below ``end`` are mapped except for the ``holes`` (left by unmapping free pages);
    everything from ``end`` on is the unmapped, unbounded rest of the virtual range. Holes never
    touch ``end``: unmapping up to it moves ``end`` down instead.
    """

    segment: int
    page: int
    end: int = 0
    mapped: int = 0
    holes: dict[int, int] = field(default_factory=dict)  # start offset -> size

    def unmapped_at(self, offset: int) -> float:
        """Size of the unmapped range starting at ``offset`` (0 if none, ``inf`` for the rest)."""
        if offset == self.end:
            return math.inf
        return self.holes.get(offset, 0)

    def unmapped_starts(self) -> list[int]:
        """Starts of the unmapped ranges, lowest address first (the open end last)."""
        return [*sorted(self.holes), self.end]

    def pages(self, nbytes: int) -> int:
        """``nbytes`` rounded up to whole pages: ``ExpandableSegment::map`` maps no less."""
        return self.page * -(-nbytes // self.page)

    def map(self, offset: int, nbytes: int) -> None:
        """Back ``nbytes`` (whole pages) at the start of the unmapped range at ``offset``."""
        if offset == self.end:
            self.end += nbytes
        else:
            rest = self.holes.pop(offset) - nbytes
            if rest:
                self.holes[offset + nbytes] = rest
        self.mapped += nbytes

    def unmap(self, lo: int, hi: int) -> None:
        """Give back the pages of ``[lo, hi)`` and merge the range with unmapped neighbours."""
        self.mapped -= hi - lo
        hi += self.holes.pop(hi, 0)
        before = next((s for s, n in self.holes.items() if s + n == lo), None)
        if before is not None:
            del self.holes[before]
            lo = before
        if hi == self.end:
            self.end = lo
        else:
            self.holes[lo] = hi - lo


class _State:
    """Mutable allocator state; only ``replay`` drives it, so the module stays pure outside."""

    def __init__(self, capacity: int | None, expandable: bool = False) -> None:
        self.capacity = capacity
        self.expandable = expandable
        self.blocks: dict[tuple[int, int], _Block] = {}  # (segment, offset) -> block
        self.ends: dict[tuple[int, int], _Block] = {}  # (segment, end offset) -> block
        self.seg_sizes: dict[int, int] = {}  # default mode: cudaMalloc-ed segments
        self.spaces: dict[bool, _Expandable] = {}  # expandable mode: small? -> its segment
        self.free_small: list[tuple[int, int, int]] = []  # sorted (size, segment, offset)
        self.free_large: list[tuple[int, int, int]] = []
        self.next_segment = 0
        self.reserved = 0
        self.peak_reserved = 0
        self.pool_reserved = {True: 0, False: 0}  # small? -> reserved bytes
        self.pool_peak = {True: 0, False: 0}
        self.allocated = 0
        self.oom = False

    # -- bookkeeping shared by both modes --------------------------------------------------

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

    def _reserve(self, small: bool, nbytes: int) -> None:
        """Account ``nbytes`` more (or, negative, fewer) reserved bytes in a pool."""
        self.reserved += nbytes
        self.pool_reserved[small] += nbytes
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        self.pool_peak[small] = max(self.pool_peak[small], self.pool_reserved[small])

    def _fits(self, nbytes: int) -> bool:
        return self.capacity is None or self.reserved + nbytes <= self.capacity

    def _coalesce(self, b: _Block) -> None:
        """Merge a block that just became free with free neighbours; cache the result."""
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

    def _grow(self, attempt: Callable[[bool], _Block | None]) -> _Block:
        """Get new memory, releasing the cache and retrying once when the device is full.

        ``attempt(force)`` returns ``None`` when it would exceed the capacity; with ``force`` it
        never fails (the replay records the OOM and goes on as if the memory existed).
        """
        b = attempt(False)
        if b is None:
            self._release_cached()
            b = attempt(False)
            if b is None:
                self.oom = True
                b = attempt(True)
                assert b is not None
        return b

    def _release_cached(self) -> None:
        if self.expandable:
            self._unmap_free_pages()
        else:
            self._release_free_segments()

    # -- default mode: one cudaMalloc per segment -------------------------------------------

    def _new_segment(self, size: int, small: bool, force: bool) -> _Block | None:
        if not force and not self._fits(size):
            return None
        seg = self.next_segment
        self.next_segment += 1
        self.seg_sizes[seg] = size
        self._reserve(small, size)
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
                self._reserve(b.small, -size)

    # -- expandable mode: one growing segment per pool --------------------------------------

    def _growable(self, entry: tuple[int, int, int], small: bool) -> float:
        """A free block's size plus the unmapped range right after it (``get_free_block``)."""
        size, _, offset = entry
        return size + self.spaces[small].unmapped_at(offset + size)

    def _free_run(self, space: _Expandable, offset: int, need: int) -> float:
        """Free plus unmapped bytes contiguous from ``offset``, counted up to ``need``."""
        total = 0
        while total < need:
            b = self.blocks.get((space.segment, offset))
            size = b.size if b is not None and b.free else space.unmapped_at(offset)
            if size == math.inf:
                return math.inf
            if not size:
                break
            total += int(size)
            offset += int(size)
        return total

    def _find_expandable(self, space: _Expandable, rounded: int) -> int:
        """Offset where ``find_expandable_block``'s candidate chain starts."""
        for start in space.unmapped_starts():
            prev = self.ends.get((space.segment, start))
            offset = prev.offset if prev is not None and prev.free else start
            if self._free_run(space, offset, rounded) >= rounded:
                return offset
        raise AssertionError("the unbounded end always has room")

    def _map(self, space: _Expandable, small: bool, offset: int, nbytes: int, force: bool) -> bool:
        """``map_block``: map whole pages for ``nbytes`` at ``offset``, merge them as free."""
        size = space.pages(nbytes)
        if not force and not self._fits(size):
            return False
        space.map(offset, size)
        self._reserve(small, size)
        b = _Block(space.segment, offset, size, False, small)
        self._put(b)
        self._coalesce(b)
        return True

    def _expand(self, rounded: int, small: bool, force: bool) -> _Block | None:
        """``try_allocate_expandable_block``: map just what the request lacks."""
        space = self.spaces.get(small)
        if space is None:
            space = self.spaces[small] = _Expandable(self.next_segment, page_size(small))
            self.next_segment += 1
        offset = self._find_expandable(space, rounded)
        while True:
            b = self.blocks.get((space.segment, offset))
            have = b.size if b is not None else 0
            if have >= rounded:
                break
            gap = offset + have  # an unmapped range starts here
            missing = int(min(rounded - have, space.unmapped_at(gap)))
            if not self._map(space, small, gap, missing, force):
                return None
        assert b is not None and b.free
        self._remove_free(b)
        return b

    def _unmap_free_pages(self) -> None:
        """``release_blocks`` -> ``unmap_block``: unmap the whole pages of every free block."""
        for small, space in list(self.spaces.items()):
            for _, seg, offset in list(self._pool(small)):
                b = self.blocks[(seg, offset)]
                lo = space.pages(b.offset)
                hi = space.page * ((b.offset + b.size) // space.page)
                if lo >= hi:
                    continue
                self._remove_free(b)
                self._drop(b)
                for start, stop in ((b.offset, lo), (hi, b.offset + b.size)):
                    if stop > start:
                        rest = _Block(seg, start, stop - start, False, small)
                        self._put(rest)
                        self._add_free(rest)
                space.unmap(lo, hi)
                self._reserve(small, lo - hi)
            if space.mapped == 0:
                del self.spaces[small]  # release_expandable_segment

    # -- the two operations ------------------------------------------------------------------

    def _take_cached(self, rounded: int, small: bool) -> _Block | None:
        """``get_free_block``: best fit; expandable blocks ranked by how far they can grow."""
        pool = self._pool(small)
        i = bisect.bisect_left(pool, (rounded, -1, -1))
        if i == len(pool):
            return None
        if self.expandable:
            grow = self._growable
            while i + 1 < len(pool) and grow(pool[i + 1], small) < grow(pool[i], small):
                i += 1
        _, seg, off = pool[i]
        b = self.blocks[(seg, off)]
        self._remove_free(b)
        return b

    def malloc(self, nbytes: int) -> tuple[int, int]:
        rounded = round_size(nbytes)
        small = is_small(rounded)
        b = self._take_cached(rounded, small)
        if b is None and self.expandable:
            b = self._grow(lambda force: self._expand(rounded, small, force))
        elif b is None:
            b = self._grow(lambda force: self._new_segment(segment_size(rounded), small, force))
        if should_split(b.size, rounded, self.expandable):
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
        self._coalesce(b)

    @property
    def segments(self) -> int:
        return len(self.spaces) if self.expandable else len(self.seg_sizes)


def replay(
    events: Iterable[Event], *, capacity_bytes: int | None = None, expandable: bool = False
) -> ReplayResult:
    """Replay ``events`` through the allocator model and return its peaks.

    ``expandable`` selects PyTorch's ``expandable_segments:True`` mode (see the module
    docstring); the default is the classic one-``cudaMalloc``-per-segment allocator.
    Frees of keys never allocated are ignored (a tracer may see a tensor die that was born
    before it started); keys still alive at the end simply stay allocated.
    """
    st = _State(capacity_bytes, expandable)
    where: dict[int, tuple[int, int]] = {}
    requested: dict[int, int] = {}
    live_req = 0
    peak_alloc = 0
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
        else:
            loc = where.pop(ev.key, None)
            if loc is not None:
                st.free(loc)
                live_req -= requested.pop(ev.key)
    return ReplayResult(
        peak_allocated=peak_alloc,
        peak_reserved=st.peak_reserved,
        peak_allocated_index=peak_idx,
        final_allocated=st.allocated,
        final_reserved=st.reserved,
        segments=st.segments,
        oom=st.oom,
        reserved_at_peak_allocated=res_at_peak,
        live_requested_at_peak=req_at_peak,
        peak_reserved_small_pool=st.pool_peak[True],
        peak_reserved_large_pool=st.pool_peak[False],
    )
