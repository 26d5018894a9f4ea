"""The CPU ring in one process: the producer's byte copy and the consumer's slot fences."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from collocate.share import ring as ring_mod
from collocate.share.errors import ProtocolError
from collocate.share.layout import layout_for
from collocate.share.ring import RingReader, RingWriter


@pytest.fixture(params=["use-count", "weak-ref"])
def pair(request, monkeypatch) -> Iterator[tuple[RingWriter, RingReader]]:
    """A writer and a reader of one ring, with the reader's fast fences or its fallback."""
    if request.param == "weak-ref":  # a torch without the private use count
        monkeypatch.delattr(torch._C, "_storage_Use_Count")
    layout = layout_for({"x": torch.zeros(8, 3, 4), "y": torch.zeros(8, dtype=torch.int64),
                         "m": torch.zeros(8, 5, dtype=torch.bool), "h": torch.zeros(8, 2, dtype=torch.bfloat16),
                         "c": torch.zeros(8, 2, dtype=torch.complex64), "e": torch.zeros(8, 0)})
    writer = RingWriter(layout, 3)
    fd = writer.readonly_fd()
    reader = RingReader(fd, layout, 3, layout.slot_bytes * 3)
    assert bool(reader._fences) == (request.param == "use-count")
    yield writer, reader
    reader.close()
    writer.close()


def _batch(n: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"x": torch.randn(n, 4, 3, generator=g).transpose(1, 2),  # not contiguous: torch copies it
            "y": torch.arange(10 * seed, 10 * seed + n),
            "m": torch.rand(n, 5, generator=g) > 0.5,
            "h": torch.randn(n, 2, generator=g).bfloat16(),
            "c": torch.randn(n, 2, dtype=torch.complex64, generator=g).conj(),  # conjugate bit: torch copies it
            "e": torch.zeros(n, 0)}


def test_batches_of_every_dtype_and_stride_arrive_exactly(pair) -> None:
    writer, reader = pair
    for slot, n in enumerate([8, 3, 8]):
        batch = _batch(n, slot)
        if slot == 2:
            batch["x"] = batch["x"].contiguous().requires_grad_()
        tensors, count = writer.layout.flatten(batch, slot)
        writer.write(slot, 100 + slot, tensors, count)
        reader.check(slot, 100 + slot)
        for got, sent in zip(reader.views(slot, 0, count), tensors, strict=True):
            assert torch.equal(got, sent.detach().resolve_conj())


@pytest.mark.parametrize("keep", ["tensor", "derived view", "storage", "numpy array"])
def test_a_slot_stays_held_while_anything_still_points_into_it(pair, keep: str) -> None:
    writer, reader = pair
    tensors, count = writer.layout.flatten(_batch(8, 1), 0)
    writer.write(1, 7, tensors, count)
    views = reader.views(1, 2, 6)
    fences = reader.fences(1, views)
    if keep == "tensor":
        kept = views[0]
    elif keep == "derived view":
        kept = views[0][1:].transpose(1, 2)[0]
    elif keep == "storage":
        kept = views[0].untyped_storage()
    else:
        kept = views[1].numpy()
    del views
    gc.collect()
    assert not all(f.expired() for f in fences), f"a kept {keep} must pin the slot"
    del kept
    gc.collect()
    assert all(f.expired() for f in fences)


def test_private_copies_join_pieces_of_slots_and_stay_inside_the_ring(pair) -> None:
    writer, reader = pair
    batches = [_batch(8, 1), _batch(8, 2)]
    for slot, batch in enumerate(batches):
        tensors, count = writer.layout.flatten(batch, slot)
        writer.write(slot, slot, tensors, count)
    got = writer.layout.empty(6)
    reader.copy([(0, 5, 8), (1, 0, 2)], got, at=1)  # row 0 stays as it was
    got = [t[1:] for t in got]
    for i, key in enumerate(batches[0]):
        want = torch.cat([batches[0][key][5:8], batches[1][key][:2]]).resolve_conj()
        assert torch.equal(got[i], want) and got[i].is_contiguous()
    got[0].add_(1)  # private and writable
    for bad in ([(3, 0, 1)], [(0, 2, 9)], [(0, 3, 2)]):
        with pytest.raises(ProtocolError, match="outside the ring"):
            reader.copy(bad, writer.layout.empty(8))
    with pytest.raises(ValueError, match="do not fit"):
        reader.copy([(0, 0, 8)], writer.layout.empty(8), at=1)


def test_a_large_batch_is_copied_in_pieces_by_several_threads_exactly() -> None:
    n = ring_mod.PARALLEL_COPY_BYTES // (4 * 64 * 64) + 5  # a little over the threshold, not page-aligned
    layout = layout_for((torch.zeros(n, 64, 64), torch.zeros(n, 3, dtype=torch.int16)))
    writer = RingWriter(layout, 2)
    writer._copier = ring_mod._Copier(3)
    reader = RingReader(writer.readonly_fd(), layout, 2, layout.slot_bytes * 2)
    try:
        batch = (torch.randn(n, 64, 64), torch.randint(-999, 999, (n, 3), dtype=torch.int16))
        tensors, count = layout.flatten(batch, 0)
        writer.write(1, 9, tensors, count)
        assert all(torch.equal(a, b) for a, b in zip(reader.views(1, 0, n), batch, strict=True))
    finally:
        reader.close()
        writer.close()


@given(st.lists(st.integers(1, 3 << 20), min_size=1, max_size=4), st.integers(2, 16))
def test_copy_pieces_cover_every_byte_once(sizes: list[int], parts: int) -> None:
    jobs, base = [], 0
    for n in sizes:
        jobs.append((base, base + (1 << 40), n))
        base += n + 64
    out = ring_mod._split(jobs, sum(sizes), parts)
    assert len(out) == parts
    pieces = sorted(piece for part in out for piece in part)
    assert all(src - dst == 1 << 40 and n > 0 for dst, src, n in pieces)
    merged: list[list[int]] = []
    for dst, _, n in pieces:
        if merged and merged[-1][1] == dst:
            merged[-1][1] += n
        else:
            merged.append([dst, dst + n])
    assert merged == [[dst, dst + n] for dst, _, n in jobs]
