"""Producer-side errors and slot pinning, with the producer on a thread of the test process."""

from __future__ import annotations

import time

import pytest
import torch

from collocate import share
from collocate.share.errors import ConsumerDetachedError, ProducerLostError


def _batches(bad_at: int | None = None):
    for i in range(1000):
        if i == bad_at:
            yield {"x": torch.zeros(4, 3), "names": ["a", "b", "c", "d"]}
        yield {"x": torch.full((4, 3), float(i)), "y": torch.arange(4) + 4 * i}


class _Loader:
    def __init__(self, bad_at: int | None = None) -> None:
        self.bad_at = bad_at

    def __iter__(self):
        return _batches(self.bad_at)


def test_a_loader_error_reaches_the_consumer_with_its_reason(state_dir) -> None:
    producer = share.serve(_Loader(bad_at=5), "err", state_dir=state_dir, slots=4, block=False)
    try:
        with share.SharedLoader("err", 4, state_dir=state_dir, connect_timeout=10) as loader, \
                pytest.raises(ProducerLostError, match="LayoutError"):
            for _ in loader:
                pass
    finally:
        producer.stop(timeout=10)


def _snapshot(kept: torch.Tensor | torch.UntypedStorage) -> torch.Tensor:
    """A private copy of every byte of the storage behind ``kept``."""
    storage = kept if isinstance(kept, torch.UntypedStorage) else kept.untyped_storage()
    return torch.empty(0, dtype=torch.uint8).set_(storage).clone()


@pytest.mark.parametrize("keep", ["tensor", "derived view", "storage"])
def test_a_kept_view_pins_its_slot_until_detach_never_silently_overwritten(state_dir, keep: str) -> None:
    producer = share.serve(_Loader(), "pin", state_dir=state_dir, slots=2, stall_timeout_s=1.0, block=False)
    try:
        with share.SharedLoader("pin", 4, state_dir=state_dir, connect_timeout=10) as loader:
            it = iter(loader)
            x = next(it)["x"]  # held beyond the next step (or a part of it): its slot must not be reused
            kept = {"tensor": x, "derived view": x[1:].t(), "storage": x.untyped_storage()}[keep]
            del x
            first = _snapshot(kept)
            with pytest.raises(ConsumerDetachedError, match="held batch 0"):
                for _batch in it:
                    assert torch.equal(_snapshot(kept), first), "a slot was overwritten while a view of it was alive"
    finally:
        producer.stop(timeout=10)


def test_finished_batches_are_released_within_a_tick_while_the_consumer_is_busy(state_dir) -> None:
    # Releases are sent a few at a time; one that is pending must still reach the producer
    # while the training step runs, or a busy consumer would hold the ring for nothing.
    producer = share.serve(_Loader(), "tick", state_dir=state_dir, slots=8, block=False)
    try:
        with share.SharedLoader("tick", 4, state_dir=state_dir, connect_timeout=10) as loader:
            it = iter(loader)
            next(it)
            deadline = time.monotonic() + 10
            while producer.stats()["head"] < 8:  # the ring is full: batches 0..7 are published
                assert time.monotonic() < deadline
                time.sleep(0.01)
            next(it)  # batch 0 is finished now, and nothing references it
            busy = time.monotonic()
            while producer.stats()["head"] < 9:  # slot 0 reused: batch 0 was released
                # within a tick (``TICK_S``) on a quiet machine; a release that waits for the
                # consumer's next batch never comes while it is busy, however long this waits
                assert time.monotonic() - busy < 10.0, "a finished batch was not released while the consumer was busy"
                time.sleep(0.01)
    finally:
        producer.stop(timeout=10)


def test_copy_mode_gives_writable_private_tensors(state_dir) -> None:
    producer = share.serve(_Loader(), "cp", state_dir=state_dir, slots=2, block=False)
    try:
        with share.SharedLoader("cp", 4, state_dir=state_dir, copy=True, connect_timeout=10) as loader:
            it = iter(loader)
            kept = [next(it)["y"] for _ in range(6)]  # copies pin nothing: more than `slots` is fine
            kept[0].add_(1)
            assert [int(k[0]) for k in kept] == [1, 4, 8, 12, 16, 20]
    finally:
        producer.stop(timeout=10)


def test_a_batch_resent_after_reattach_is_not_released_by_its_old_view(state_dir) -> None:
    # A consumer stops mid-slot while a view of that slot lives, re-attaches (the producer sends
    # the slot again), then the old view dies. That must not release the re-sent batch.
    producer = share.serve(_Loader(), "re", state_dir=state_dir, slots=2, block=False)
    try:
        with share.SharedLoader("re", 2, state_dir=state_dir, connect_timeout=10) as loader:
            it = iter(loader)
            kept = next(it)  # samples 0-1 of producer batch 0; the consumer stops inside it
            it.close()
            loader.attach()  # the producer re-sends batch 0 (and 1)
            del kept
            time.sleep(0.3)  # housekeeping runs meanwhile and sees the old view gone
            batch = next(iter(loader))
            assert batch["y"].tolist() == [0, 1] and torch.equal(batch["x"], torch.zeros(2, 3))
    finally:
        producer.stop(timeout=10)
