"""Producer factories for the shared-dataset tests (``--dataset-factory _dataset_factory:NAME``).

Imported by the producer the daemon starts, from the job's cwd (this directory)."""

from __future__ import annotations

import os
import time

import torch

BATCHES, BATCH = 5, 4  # 20 samples: id i has x == [i, i]


def tiny() -> list[dict[str, torch.Tensor]]:
    """A fixed order every epoch, so one consumer epoch is every id exactly once."""
    return [{"id": torch.arange(b * BATCH, (b + 1) * BATCH),
             "x": torch.arange(b * BATCH, (b + 1) * BATCH, dtype=torch.float32).repeat(2, 1).T.contiguous()}
            for b in range(BATCHES)]


def other() -> list[dict[str, torch.Tensor]]:
    return tiny()


def slow() -> list[dict[str, torch.Tensor]]:
    """``tiny``, a loader slow to build: once the file ``SLOW_FACTORY_GATE`` exists (from the
    job's env: still building until the test opens it, however loaded the machine), else after
    ``SLOW_FACTORY_S`` seconds."""
    gate = os.environ.get("SLOW_FACTORY_GATE")
    if gate:
        while not os.path.exists(gate):
            time.sleep(0.05)
    else:
        time.sleep(float(os.environ.get("SLOW_FACTORY_S", "5")))
    return tiny()


def broken() -> list[dict[str, torch.Tensor]]:
    raise RuntimeError("the test factory refuses to build a loader")
