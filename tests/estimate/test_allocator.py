"""The caching-allocator model against hand-computed cases (sizes in the comments)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from collocate.estimate.allocator import (
    LARGE_PAGE,
    SMALL_PAGE,
    Alloc,
    Free,
    is_small,
    page_size,
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


def _timeline(ops: list[tuple[bool, int]]) -> tuple[list[Alloc | Free], list[int]]:
    """Turn (free one?, size) draws into events; returns them and the keys left alive."""
    events: list[Alloc | Free] = []
    live: list[int] = []
    for i, (free_one, size) in enumerate(ops):
        if free_one and live:
            events.append(Free(live.pop(size % len(live))))
        else:
            events.append(Alloc(i, size))
            live.append(i)
    return events, live


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 24 * MiB)), min_size=1, max_size=60))
def test_invariants_random_timelines(ops: list[tuple[bool, int]]) -> None:
    events, live = _timeline(ops)
    r = replay(events)
    assert r.peak_reserved >= r.peak_allocated
    assert r.peak_allocated >= r.live_requested_at_peak
    r_all = replay(events + [Free(k) for k in live])
    assert r_all.final_allocated == 0
    assert r_all.final_reserved == r.final_reserved  # segments stay cached


# -- expandable segments (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True) --------------------


def test_expandable_pages_per_pool() -> None:
    assert page_size(small=True) == SMALL_PAGE == 2 * MiB
    assert page_size(small=False) == LARGE_PAGE == 20 * MiB


def test_expandable_split_keeps_no_slack() -> None:
    # expandable mode splits large blocks like small ones: any remainder >= 512 B
    assert should_split(20 * MiB, 19 * MiB, expandable=True)
    assert should_split(20 * MiB, 20 * MiB - 512, expandable=True)
    assert not should_split(20 * MiB, 20 * MiB, expandable=True)


def test_expandable_maps_whole_large_pages() -> None:
    # 30 MiB: default cudaMallocs a 30 MiB segment; expandable maps two 20 MiB pages (40 MiB)
    # and keeps the 10 MiB rest as a free block at the end of the segment
    assert replay([Alloc(1, 30 * MiB)]).peak_reserved == 30 * MiB
    r = replay([Alloc(1, 30 * MiB)], expandable=True)
    assert r.peak_reserved == r.peak_reserved_large_pool == 40 * MiB
    assert r.peak_allocated == 30 * MiB
    assert r.segments == 1


def test_expandable_small_request_maps_one_2mib_page() -> None:
    r = replay([Alloc(1, KiB)], expandable=True)
    assert r.peak_reserved == r.peak_reserved_small_pool == 2 * MiB
    assert r.peak_reserved_large_pool == 0
    assert r.peak_allocated == KiB


def test_expandable_one_segment_per_pool() -> None:
    # 1 KiB -> small pool page (2 MiB); 3 MiB -> large pool page (20 MiB): two segments
    r = replay([Alloc(1, KiB), Alloc(2, 3 * MiB), Alloc(3, 5 * MiB)], expandable=True)
    assert r.segments == 2
    assert (r.peak_reserved_small_pool, r.peak_reserved_large_pool) == (2 * MiB, 20 * MiB)
    assert r.peak_reserved == 22 * MiB


def test_expandable_hands_out_exact_rounded_sizes() -> None:
    # 19.5 MiB: default hands out the whole 20 MiB segment (0.5 MiB rest is not split off),
    # expandable splits the 0.5 MiB off, so only 19.5 MiB count as allocated
    assert replay([Alloc(1, 19 * MiB + 512 * KiB)]).peak_allocated == 20 * MiB
    r = replay([Alloc(1, 19 * MiB + 512 * KiB)], expandable=True)
    assert r.peak_allocated == 19 * MiB + 512 * KiB
    assert r.peak_reserved == 20 * MiB


def test_expandable_grows_a_free_block_at_the_end() -> None:
    # A(40) maps [0,40), B(40) maps [40,80); B is freed, so [40,80) is free and ends where
    # the unmapped rest begins. C(50) does not fit in it: default cudaMallocs a 50 MiB segment
    # (40+40+50 = 130), expandable maps only the missing 10 MiB, i.e. one 20 MiB page: 100
    events = [Alloc(1, 40 * MiB), Alloc(2, 40 * MiB), Free(2), Alloc(3, 50 * MiB)]
    d = replay(events)
    assert (d.peak_reserved, d.segments) == (130 * MiB, 3)
    e = replay(events, expandable=True)
    assert (e.peak_reserved, e.segments) == (100 * MiB, 1)
    assert e.final_allocated == 90 * MiB


def test_expandable_free_block_inside_the_segment_cannot_grow() -> None:
    # same, but A is freed: [0,40) is walled in by B, so C(50) maps 3 pages at the end
    # (40+40+60 = 140), more than default's 130: only memory next to the end is reused
    events = [Alloc(1, 40 * MiB), Alloc(2, 40 * MiB), Free(1), Alloc(3, 50 * MiB)]
    assert replay(events).peak_reserved == 130 * MiB
    assert replay(events, expandable=True).peak_reserved == 140 * MiB


def test_expandable_best_fit_keeps_the_growable_end_for_last() -> None:
    # A(6) maps a 20 MiB page: A [0,6), B(9) [6,15), free end [15,20) (5 MiB). Freeing A
    # leaves [0,6) (6 MiB, walled in by B). C(4): plain best fit would take the 5 MiB end
    # block, but get_free_block ranks the end block by what it can grow to (unbounded), so
    # C goes to [0,4). D(6) then fits nowhere ([4,6) is 2 MiB, the end 5 MiB) and the end
    # grows by one page: 40 MiB. (Had C taken the end, D would fit in [0,6): 20 MiB.)
    events = [Alloc(1, 6 * MiB), Alloc(2, 9 * MiB), Free(1), Alloc(3, 4 * MiB)]
    assert replay(events, expandable=True).peak_reserved == 20 * MiB
    assert replay([*events, Alloc(4, 6 * MiB)], expandable=True).peak_reserved == 40 * MiB


def test_expandable_avoids_classic_fragmentation() -> None:
    # ten 50 MiB tensors, all freed, then ten 52 MiB ones (a batch that grew a little).
    # default: no 50 MiB segment holds 52 MiB, so ten new segments: 500 + 520 = 1020 MiB.
    # expandable: the freed 500 MiB are one block; nine 52s fit, the tenth grows the end
    # by one page: 520 MiB reserved for 520 MiB allocated.
    events: list[Alloc | Free] = [Alloc(i, 50 * MiB) for i in range(10)]
    events += [Free(i) for i in range(10)]
    events += [Alloc(10 + i, 52 * MiB) for i in range(10)]
    d = replay(events)
    assert (d.peak_reserved, d.peak_allocated) == (1020 * MiB, 520 * MiB)
    e = replay(events, expandable=True)
    assert (e.peak_reserved, e.peak_allocated) == (520 * MiB, 520 * MiB)


def test_expandable_freed_memory_stays_mapped() -> None:
    r = replay([Alloc(1, 30 * MiB), Alloc(2, KiB), Free(1), Free(2)], expandable=True)
    assert r.final_allocated == 0
    assert r.final_reserved == 42 * MiB
    assert r.segments == 2


def test_expandable_capacity_unmaps_free_pages() -> None:
    # 60 MiB device. A(20) [0,20), B(20) [20,40); A freed. C(30) needs 2 more pages (80 MiB):
    # too much, so the cached page [0,20) is unmapped (a hole) and C maps [40,80): 60 MiB.
    events = [Alloc(1, 20 * MiB), Alloc(2, 20 * MiB), Free(1), Alloc(3, 30 * MiB)]
    assert replay(events, expandable=True).final_reserved == 80 * MiB  # unlimited: cached
    r = replay(events, capacity_bytes=60 * MiB, expandable=True)
    assert (r.final_reserved, r.peak_reserved, r.oom) == (60 * MiB, 60 * MiB, False)
    assert replay([Alloc(1, 50 * MiB)], capacity_bytes=40 * MiB, expandable=True).oom


def test_expandable_capacity_releases_an_emptied_segment() -> None:
    # 20 MiB device: the freed 1 KiB leaves a whole free 2 MiB small page; the 3 MiB request
    # needs a 20 MiB large page, so the small page is unmapped and its segment released
    events = [Alloc(1, KiB), Free(1), Alloc(2, 3 * MiB)]
    r = replay(events, capacity_bytes=20 * MiB, expandable=True)
    assert (r.final_reserved, r.segments, r.oom) == (20 * MiB, 1, False)
    assert r.peak_reserved_small_pool == 2 * MiB


def test_expandable_refills_unmapped_holes_first() -> None:
    # 110 MiB device. A(40) [0,40), B(20) [40,60); A freed. C(50) would make 120 MiB, so
    # [0,40) is unmapped; it cannot hold C (B follows it), so C maps [60,120): 80 MiB.
    events = [Alloc(1, 40 * MiB), Alloc(2, 20 * MiB), Free(1), Alloc(3, 50 * MiB)]
    r = replay(events, capacity_bytes=110 * MiB, expandable=True)
    assert (r.final_reserved, r.oom) == (80 * MiB, False)
    # D(25): find_expandable_block takes the lowest unmapped range that fits, the hole, and
    # maps 2 pages there (120 MiB), although growing the free end [110,120) by one page
    # would have fitted: like PyTorch, this runs out of memory
    r = replay([*events, Alloc(4, 25 * MiB)], capacity_bytes=110 * MiB, expandable=True)
    assert (r.final_reserved, r.oom) == (120 * MiB, True)


request_sizes = st.one_of(st.integers(1, 1 * MiB), st.integers(1, 48 * MiB))


def _peak_live_rounded(events: list[Alloc | Free]) -> int:
    live: dict[int, int] = {}
    peak = 0
    for ev in events:
        if isinstance(ev, Alloc):
            live[ev.key] = round_size(ev.nbytes)
            peak = max(peak, sum(live.values()))
        else:
            live.pop(ev.key, None)
    return peak


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), request_sizes), min_size=1, max_size=60))
def test_expandable_invariants_random_timelines(ops: list[tuple[bool, int]]) -> None:
    events, live = _timeline(ops)
    e = replay(events, expandable=True)
    # every block handed out is exactly the rounded request (remainders >= 512 B are split
    # off), so allocated is the live rounded bytes; default mode may hand out up to 1 MiB
    # more per large block, never less
    assert e.peak_allocated == _peak_live_rounded(events)
    assert replay(events).peak_allocated >= e.peak_allocated
    assert e.peak_reserved >= e.peak_allocated
    assert e.final_reserved <= e.peak_reserved
    # memory is mapped in whole pages per pool
    assert e.peak_reserved_small_pool % SMALL_PAGE == 0
    assert e.peak_reserved_large_pool % LARGE_PAGE == 0
    assert e.final_reserved % SMALL_PAGE == 0
    assert e.peak_reserved <= e.peak_reserved_small_pool + e.peak_reserved_large_pool
    assert e.segments <= 2
    e_all = replay(events + [Free(k) for k in live], expandable=True)
    assert e_all.final_allocated == 0
    assert e_all.final_reserved == e.final_reserved  # freed pages stay mapped


@settings(max_examples=60, deadline=None)
@given(st.lists(request_sizes, min_size=1, max_size=40))
def test_expandable_allocations_only_pack_densely(nbytes: list[int]) -> None:
    # with no frees each pool's segment is filled front to back: mapped bytes are the pool's
    # rounded bytes rounded up to its page
    r = replay([Alloc(i, n) for i, n in enumerate(nbytes)], expandable=True)
    small = sum(round_size(n) for n in nbytes if is_small(round_size(n)))
    large = sum(round_size(n) for n in nbytes if not is_small(round_size(n)))
    assert r.peak_reserved_small_pool == -(-small // SMALL_PAGE) * SMALL_PAGE
    assert r.peak_reserved_large_pool == -(-large // LARGE_PAGE) * LARGE_PAGE
    assert r.peak_allocated == small + large


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 1 * MiB)), min_size=1, max_size=60))
def test_modes_agree_on_small_pool_allocated(ops: list[tuple[bool, int]]) -> None:
    # the small pool splits at >= 512 B in both modes, so allocated bytes are identical
    events, _ = _timeline(ops)
    d, e = replay(events), replay(events, expandable=True)
    assert d.peak_allocated == e.peak_allocated == _peak_live_rounded(events)
    assert d.peak_allocated_index == e.peak_allocated_index


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.booleans(), request_sizes), min_size=1, max_size=60),
    st.integers(20, 400),
    st.booleans(),
)
def test_capacity_is_respected_unless_oom(
    ops: list[tuple[bool, int]], capacity_mib: int, expandable: bool
) -> None:
    events, _ = _timeline(ops)
    cap = capacity_mib * MiB
    r = replay(events, capacity_bytes=cap, expandable=expandable)
    assert r.oom or r.peak_reserved <= cap
    assert r.final_reserved <= r.peak_reserved
    unlimited = replay(events, expandable=expandable)
    if unlimited.peak_reserved <= cap:  # the cache is never released: same replay
        assert r == unlimited
