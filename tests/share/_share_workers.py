"""Process entry points for the shared-loading tests (importable by spawned children)."""

from __future__ import annotations

import os
import time
import traceback
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset


class Sender:
    """The write end of one worker's own pipe. A shared mp.Queue would not do: a worker killed
    while its feeder thread holds the queue's lock blocks every other writer for ever. Defined
    here, not in conftest: pickled into children, it must be importable by an unambiguous name."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    def put(self, obj: Any) -> None:
        self.conn.send(obj)


class IdDataset(Dataset):
    """Sample i is {"x": [i, i, i, i] (float), "id": i}: content and identity can be cross-checked."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": torch.full((4,), float(i)), "id": torch.tensor(i)}


def make_loader(n: int = 103, batch_size: int = 8, shuffle: bool = False) -> DataLoader:
    return DataLoader(IdDataset(n), batch_size=batch_size, shuffle=shuffle)


def default_loader() -> DataLoader:
    """The ``module:factory`` target the lifecycle and CLI tests launch."""
    return make_loader()


class SlowLoader:
    """Yields loader batches with a delay, so tests can join in the middle of an epoch."""

    def __init__(self, loader: DataLoader, delay: float) -> None:
        self.loader, self.delay = loader, delay

    def __iter__(self):
        for batch in self.loader:
            time.sleep(self.delay)
            yield batch

    def __len__(self) -> int:
        return len(self.loader)


def produce(name: str, state_dir: str, n: int = 103, batch_size: int = 8, shuffle: bool = False,
            delay: float = 0.0, **options: Any) -> None:
    from collocate import share

    loader: Any = make_loader(n, batch_size, shuffle)
    if delay:
        loader = SlowLoader(loader, delay)
    options.setdefault("heartbeat_s", 0.1)
    options.setdefault("consumer_timeout_s", 3.0)
    share.serve(loader, name, state_dir=state_dir, samples_per_epoch=n, **options)


def consume(name: str, state_dir: str, queue: Any, tag: str, batch_size: int | None = None, epochs: int = 2,
            sleep: float = 0.0, pause_at: int | None = None, pause_s: float = 0.0, between_epochs_s: float = 0.0,
            inplace: bool = False, copy: bool = False, join: str = "now", timeout: float = 5.0) -> None:
    """Iterate ``epochs`` epochs; report (tag, "epoch", ids, xs_ok) per epoch, then (tag, "done", ...) or (tag, "error", ...)."""
    from collocate import share

    try:
        loader = share.SharedLoader(name, batch_size, state_dir=state_dir, timeout=timeout, connect_timeout=20,
                                    copy=copy, join=join, label=f"test-{os.getpid()}")
        queue.put((tag, "ready", os.getpid(), len(loader)))
        step = 0
        for epoch in range(epochs):
            ids: list[int] = []
            ok = True
            for batch in loader:
                if inplace:
                    batch["x"].add_(1000.0)
                ok &= bool(torch.equal(batch["x"][:, 0].long(), batch["id"]))
                ids += batch["id"].tolist()
                step += 1
                if pause_at is not None and step == pause_at:
                    time.sleep(pause_s)
                if sleep:
                    time.sleep(sleep)
            queue.put((tag, "epoch", ids, ok))
            if epoch + 1 < epochs:
                time.sleep(between_epochs_s)  # evaluation / checkpointing between epochs
        loader.close()
        queue.put((tag, "done", os.getpid(), None))
    except BaseException as exc:
        queue.put((tag, "error", type(exc).__name__, f"{exc}\n{traceback.format_exc()}"))
