"""Producer-side errors and slot pinning, with the producer on a thread of the test process."""

from __future__ import annotations

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


def test_a_kept_view_pins_its_slot_until_detach_never_silently_overwritten(state_dir) -> None:
    producer = share.serve(_Loader(), "pin", state_dir=state_dir, slots=2, stall_timeout_s=1.0, block=False)
    try:
        with share.SharedLoader("pin", 4, state_dir=state_dir, connect_timeout=10) as loader:
            it = iter(loader)
            kept = next(it)["x"]  # held beyond the next step: its slot must not be reused
            first = kept.clone()
            with pytest.raises(ConsumerDetachedError, match="held batch 0"):
                for batch in it:
                    assert torch.equal(kept, first), "a slot was overwritten while a view of it was alive"
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
