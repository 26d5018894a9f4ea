"""Sharing semantics with real processes: coverage, batch sizes, late join, read-only views."""

from __future__ import annotations

import math
import mmap
import os
import signal

import _share_workers
import pytest
import torch
from _share_workers import consume, produce

from collocate import share
from collocate.share.layout import layout_for
from collocate.share.ring import RingReader, RingWriter

N = 103  # not a multiple of any batch size used, so epoch tails are exercised


def _assert_window(ids: list[int], n: int = N) -> None:
    """One consumer epoch: n samples, each exactly once, in stream order (a rotation of 0..n-1)."""
    assert len(ids) == n, f"{len(ids)} samples, expected {n}"
    assert sorted(ids) == list(range(n)), "some samples missing or repeated"
    start = ids[0]
    assert ids == [(start + k) % n for k in range(n)], "samples out of stream order"


def test_mixed_batch_sizes_cover_every_sample_once_per_epoch(procs, state_dir) -> None:
    procs.start(produce, "mixed", state_dir, N, 8, slots=4)
    sizes = {"a": 5, "b": 8, "c": 13}
    for tag, bs in sizes.items():
        procs.start(consume, "mixed", state_dir, procs.queue, tag, bs, 3)
    results = procs.collect(list(sizes))
    for tag, bs in sizes.items():
        msgs = results[tag]
        assert msgs[-1][0] == "done", msgs[-1]
        assert msgs[0] == ("ready", msgs[0][1], math.ceil(N / bs))
        epochs = [m for m in msgs if m[0] == "epoch"]
        assert len(epochs) == 3
        for _, ids, content_ok in epochs:
            _assert_window(ids)
            assert content_ok, "a sample's tensor did not match its id"


def test_late_joiner_starts_mid_epoch_and_still_gets_whole_epochs(procs, state_dir) -> None:
    procs.start(produce, "late", state_dir, N, 8, slots=6)
    first = share.SharedLoader("late", 8, state_dir=state_dir, connect_timeout=20)
    it = iter(first)
    seen = [next(it)["id"].tolist() for _ in range(4)]  # the main process is consumer 1, mid-epoch
    procs.start(consume, "late", state_dir, procs.queue, "late", 7, 2)
    procs.ready("late")
    rest = [b["id"].tolist() for b in it]
    _assert_window([i for batch in seen + rest for i in batch])
    results = procs.collect(["late"])["late"]
    assert results[-1][0] == "done", results[-1]
    epochs = [m[1] for m in results if m[0] == "epoch"]
    assert epochs[0][0] != 0, "the joiner should start where the running consumer was, not at epoch start"
    for ids in epochs:
        _assert_window(ids)
    first.close()


def test_join_at_epoch_gives_exact_coverage_with_a_reshuffling_loader(procs, state_dir) -> None:
    procs.start(produce, "shuffled", state_dir, 50, 8, shuffle=True, slots=4)
    procs.start(consume, "shuffled", state_dir, procs.queue, "s", 6, 2, join="epoch")
    results = procs.collect(["s"])["s"]
    assert results[-1][0] == "done", results[-1]
    epochs = [m[1] for m in results if m[0] == "epoch"]
    assert len(epochs) == 2 and epochs[0] != epochs[1], "the loader should reshuffle between epochs"
    for ids in epochs:
        assert sorted(ids) == list(range(50))


def test_views_are_read_only_and_copies_are_private(procs, state_dir) -> None:
    procs.start(produce, "ro", state_dir, N, 8, slots=4)
    writer = procs.start(consume, "ro", state_dir, procs.queue, "writer", 8, 1, inplace=True)
    procs.start(consume, "ro", state_dir, procs.queue, "copier", 8, 1, inplace=True, copy=True)
    procs.start(consume, "ro", state_dir, procs.queue, "reader", 8, 2)
    results = procs.collect(["copier", "reader"])
    writer.join(20)
    # The view lies in memory mapped read-only (see the next test), so the write never lands:
    # the CPU faults, or a torch that knows the buffer is read-only refuses it; both are fine.
    if writer.exitcode != -signal.SIGSEGV:
        assert writer.exitcode == 0, writer.exitcode
        wrote = procs.collect(["writer"], timeout=5)["writer"]
        assert [m[0] for m in wrote] == ["ready", "error"], wrote
        assert "add_(1000.0)" in wrote[-1][2], "the writer failed elsewhere than at its write"
    assert results["copier"][-1][0] == "done"  # copies are writable
    assert [m[2] for m in results["copier"] if m[0] == "epoch"] == [False]  # ... and it did write them
    epochs = [m for m in results["reader"] if m[0] == "epoch"]
    assert epochs and all(ok for _, _, ok in epochs), "another consumer's write corrupted shared data"
    for _, ids, _ in epochs:
        _assert_window(ids)


def test_views_point_into_memory_the_os_maps_read_only() -> None:
    """What makes views read-only: the consumer's mapping has no write permission, and its
    descriptor cannot be mapped writable again."""
    layout = layout_for({"x": torch.zeros(4, 3)})
    writer = RingWriter(layout, 2)
    fd = writer.readonly_fd()
    try:
        reader = RingReader(fd, layout, 2, layout.slot_bytes * 2)
        writer.write(1, 7, [torch.ones(4, 3)], 4)
        view = reader.views(1, 0, 4)[0]
        assert torch.equal(view, torch.ones(4, 3))
        assert "w" not in _permissions_at(view.data_ptr())
        with pytest.raises(PermissionError):
            mmap.mmap(fd, layout.slot_bytes * 2)  # read-write, shared
        del view
        reader.close()
    finally:
        os.close(fd)
        writer.close()


def _permissions_at(address: int) -> str:
    """The permissions ("r--s", ...) of this process's mapping holding ``address``."""
    for line in open("/proc/self/maps"):
        span, perms = line.split()[:2]
        lo, hi = (int(a, 16) for a in span.split("-"))
        if lo <= address < hi:
            return perms
    raise AssertionError(f"no mapping holds {address:#x}")


def test_len_set_epoch_and_stop_iteration_like_a_dataloader(procs, state_dir) -> None:
    procs.start(produce, "dl", state_dir, 20, 4, slots=3)
    with share.SharedLoader("dl", 6, state_dir=state_dir, connect_timeout=20, drop_last=True) as loader:
        assert len(loader) == 3
        loader.set_epoch(5)
        sizes = [len(b["id"]) for b in loader]
        assert sizes == [6, 6, 6] and loader.epoch == 6
        assert [len(b["id"]) for b in loader] == [6, 6, 6]
    assert _share_workers.make_loader(20, 4).batch_size == 4


def test_a_batch_bigger_than_the_whole_ring_is_served_not_stalled(procs, state_dir) -> None:
    # 2 slots of 8 samples hold 16; these batches need 5-6 and 13-14 producer batches each
    procs.start(produce, "big", state_dir, N, 8, slots=2, stall_timeout_s=2.0)
    sizes = {"big": 40, "whole": 100, "small": 5}
    for tag, bs in sizes.items():
        procs.start(consume, "big", state_dir, procs.queue, tag, bs, 2)
    results = procs.collect(list(sizes), timeout=60)
    for tag in sizes:
        msgs = results[tag]
        assert msgs[-1][0] == "done", msgs[-1]
        epochs = [m for m in msgs if m[0] == "epoch"]
        assert len(epochs) == 2
        for _, ids, content_ok in epochs:
            _assert_window(ids)
            assert content_ok, "a sample's tensor did not match its id"
