"""The caching-allocator model against hand-computed cases (sizes in the comments)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from collocate.estimate.allocator import (
    Alloc,
    Free,
    replay,
    round_size,
    segment_size,
    should_split,
)

KiB, MiB = 1 << 10, 1 << 20


def test_round_size_to_512_bytes() -> None:
    assert round_size(0) == 512
    assert round_size(1) == 512
    assert round_size(512) == 512
    assert round_size(513) == 1024
    assert round_size(4 * MiB + 1) == 4 * MiB + 512


def test_segment_sizes_per_pool() -> None:
    assert segment_size(512) == 2 * MiB  # small pool
    assert segment_size(1 * MiB) == 2 * MiB  # 1 MiB is still small
    assert segment_size(1 * MiB + 512) == 20 * MiB  # large pool, < 10 MiB
    assert segment_size(10 * MiB - 512) == 20 * MiB
    assert segment_size(10 * MiB) == 10 * MiB  # >= 10 MiB: rounded to 2 MiB
    assert segment_size(11 * MiB) == 12 * MiB


def test_split_thresholds() -> None:
    assert should_split(2 * MiB, 512 * KiB)  # small: remainder >= 512 B
    assert not should_split(1024, 1024)
    assert not should_split(20 * MiB, 19 * MiB)  # large: remainder 1 MiB is not > 1 MiB
    assert should_split(20 * MiB, 18 * MiB)


def test_small_allocations_share_2mib_segments() -> None:
    # four 512 KiB tensors fill one 2 MiB segment; the fifth needs a second one
    events = [Alloc(i, 512 * KiB) for i in range(5)]
    r = replay(events)
    assert r.peak_reserved == 4 * MiB
    assert r.peak_allocated == 5 * 512 * KiB
    assert r.segments == 2


def test_large_allocation_reuses_split_remainder() -> None:
    # 3 MiB -> new 20 MiB segment, split; second 3 MiB comes from the 17 MiB remainder
    r = replay([Alloc(1, 3 * MiB), Alloc(2, 3 * MiB)])
    assert r.peak_reserved == 20 * MiB
    assert r.peak_allocated == 6 * MiB


def test_unsplit_block_counts_whole() -> None:
    # 19.5 MiB -> a 20 MiB segment; the 0.5 MiB rest is not split off, so 20 MiB is allocated
    r = replay([Alloc(1, 19 * MiB + 512 * KiB)])
    assert r.peak_reserved == 20 * MiB
    assert r.peak_allocated == 20 * MiB


def test_fragmentation_needs_new_segment() -> None:
    # A(12) and B(12) each get their own 12 MiB segment; freeing A leaves a 12 MiB hole
    # that cannot hold C(14): a third segment of 14 MiB is reserved -> 38 MiB
    r = replay([Alloc(1, 12 * MiB), Alloc(2, 12 * MiB), Free(1), Alloc(3, 14 * MiB)])
    assert r.peak_reserved == 38 * MiB
    assert r.final_allocated == 26 * MiB


def test_free_blocks_merge_with_neighbours() -> None:
    # two 3 MiB blocks from one 20 MiB segment; both freed -> merged 20 MiB block serves 18 MiB
    r = replay([Alloc(1, 3 * MiB), Alloc(2, 3 * MiB), Free(1), Free(2), Alloc(3, 18 * MiB)])
    assert r.peak_reserved == 20 * MiB
    assert r.segments == 1


def test_best_fit_picks_smallest_block() -> None:
    # free holes of 12 MiB and 16 MiB (own segments); an 11 MiB request takes the 12 MiB one
    # (remainder 1 MiB: not split, so allocated is the whole 12 MiB); 15 MiB then takes the 16
    events = [Alloc(1, 12 * MiB), Alloc(2, 16 * MiB), Free(1), Free(2), Alloc(3, 11 * MiB)]
    r = replay(events)
    assert r.final_allocated == 12 * MiB
    r2 = replay([*events, Alloc(4, 15 * MiB)])
    assert r2.peak_reserved == 28 * MiB  # no new segment
    assert r2.final_allocated == 28 * MiB


def test_capacity_releases_cached_segments_first() -> None:
    # 30 MiB device: 12 MiB freed stays cached; a 20 MiB request would make 32 MiB reserved,
    # so the cached segment is released first and the request fits
    events = [Alloc(1, 12 * MiB), Free(1), Alloc(2, 20 * MiB)]
    assert replay(events).peak_reserved == 32 * MiB  # unlimited device keeps the cache
    r = replay(events, capacity_bytes=30 * MiB)
    assert r.final_reserved == 20 * MiB and not r.oom
    assert replay([Alloc(1, 40 * MiB)], capacity_bytes=30 * MiB).oom


def test_unknown_frees_and_repeated_allocs_are_ignored() -> None:
    r = replay([Free(7), Alloc(1, 1000), Alloc(1, 1000)])
    assert r.peak_allocated == 1024


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 24 * MiB)), min_size=1, max_size=60))
def test_invariants_random_timelines(ops: list[tuple[bool, int]]) -> None:
    events: list[Alloc | Free] = []
    live: list[int] = []
    for i, (free_one, size) in enumerate(ops):
        if free_one and live:
            events.append(Free(live.pop(size % len(live))))
        else:
            events.append(Alloc(i, size))
            live.append(i)
    r = replay(events)
    assert r.peak_reserved >= r.peak_allocated
    assert r.peak_allocated >= r.live_requested_at_peak
    r_all = replay(events + [Free(k) for k in live])
    assert r_all.final_allocated == 0
    assert r_all.final_reserved == r.final_reserved  # segments stay cached
