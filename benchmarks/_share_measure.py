"""One common-window throughput measurement of K data consumers, for share_cpu.py and share_gpu.py.

A measurement starts an optional producer process and K consumer processes. Each consumer reports
the time of its first batch; the parent then sends all of them one window start, ``warmup`` s
after the last consumer's first batch, so every consumer is counted over the same interval and no
one's start-up counts against the others. A consumer whose iterator raised, whose DataLoader
worker died or that got no batch at all reports an error, and the measurement raises instead of
returning a lower number.

The scripts supply two module-level functions (spawned children import them by name):
``batches(*args)`` yields the size of every batch a consumer has finished with, and the
optional ``serve(*args)`` runs the producer until it is stopped.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch

CTX = mp.get_context("spawn")
FIRST_BATCH_TIMEOUT_S = 60.0  # a consumer's start-up: imports, connection, loader workers, first batch

Batches = Callable[..., Iterable[int]]
Producer = tuple[Callable[..., Any], tuple[Any, ...]]


def child_setup() -> None:
    """Every benchmark child: one torch thread, and DataLoader workers started by fork.

    A spawned child inherits "spawn" as its default start method, so each DataLoader worker would be
    a fresh interpreter that imports torch and the script and reads the pickled dataset (1.4 MiB)
    before the next one starts: 2+ s per worker, in sequence, and a child stopped meanwhile leaves a
    worker dying with "pickle data was truncated". Fork is what a training script run on Linux uses.
    """
    torch.set_num_threads(1)
    mp.set_start_method("fork", force=True)


def measure(batch_sizes: Callable[[], Iterable[int]], index: int, window: float, out: Any, go: Any) -> None:
    """Count the samples that arrive in the window the parent sends on ``go``; then exit.

    Messages on ``out``: ("first", index, time of the first batch), then ("ok", index, samples) or
    ("error", index, why). Iteration runs on a thread, so a consumer whose source blocks still
    reports on time; an exception in it, or a dead DataLoader worker, is an error, not a lower count.
    Times are ``time.monotonic()``, one clock for all processes on Linux.
    """
    stamps: list[tuple[float, int]] = []
    failed: list[str] = []

    def loop() -> None:
        try:
            for n in batch_sizes():
                stamps.append((time.monotonic(), n))
        except BaseException as exc:
            failed.append(repr(exc))

    threading.Thread(target=loop, daemon=True).start()
    deadline = time.monotonic() + FIRST_BATCH_TIMEOUT_S
    while not stamps and not failed and time.monotonic() < deadline:
        time.sleep(0.01)
    counted = 0
    if stamps:
        out.put(("first", index, stamps[0][0]))
        workers = mp.active_children()  # this consumer's DataLoader workers, if it has any
        begin = go.get(timeout=FIRST_BATCH_TIMEOUT_S + 30)
        time.sleep(max(0.0, begin + window - time.monotonic()))
        counted = sum(n for t, n in list(stamps) if begin <= t < begin + window)
        failed += [f"DataLoader worker {p.pid} exited with code {p.exitcode}" for p in workers
                   if p.exitcode is not None]
    elif not failed:
        failed.append(f"no batch within {FIRST_BATCH_TIMEOUT_S:g} s")
    out.put(("error", index, "; ".join(failed)) if failed else ("ok", index, counted))
    for p in mp.active_children():  # stop the workers before exiting, so none runs on into the next measurement
        p.terminate()
        p.join(5)
    out.close()
    out.join_thread()
    os._exit(0)  # the source may be blocked on a producer that is about to go: do not wait for it


def collect(tag: str, procs: list[Any], consumers: int, results: Any, timeout: float) -> dict[int, Any]:
    """One ``tag`` message from each consumer; RuntimeError on an error message, a dead process or
    the timeout. Consumers exit 0 once they reported; any other process (the producer) must live."""
    got: dict[int, Any] = {}
    deadline = time.monotonic() + timeout
    while len(got) < consumers:
        try:
            kind, index, value = results.get(timeout=1.0)
        except queue.Empty:
            codes = [p.exitcode for p in procs]
            if any(c not in (None, 0) for c in codes) or any(c is not None for c in codes[:len(procs) - consumers]):
                raise RuntimeError(f"a benchmark process exited while waiting for {tag!r} (exit codes {codes}, "
                                   f"producer first if any); its output, if any, is in the log above") from None
            if time.monotonic() > deadline:
                raise RuntimeError(f"no {tag!r} from consumers {sorted(set(range(consumers)) - set(got))} "
                                   f"within {timeout:g} s") from None
            continue
        if kind == "error":
            raise RuntimeError(f"consumer {index}: {value}")
        got[index] = value
    return got


def stop(procs: list[Any], consumers: list[Any]) -> None:
    """Shutdown order: ``consumers`` that reported exit by themselves (after stopping their loader
    workers); then SIGTERM to the rest (the producer stops gracefully), SIGKILL after 10 s."""
    deadline = time.monotonic() + 10
    for p in consumers:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.exitcode is None:
            p.terminate()
    for p in procs:
        p.join(10)
        if p.is_alive():
            p.kill()
            p.join(5)
        p.close()


def _consumer(batches: Batches, args: tuple[Any, ...], index: int, window: float, out: Any, go: Any) -> None:
    child_setup()
    measure(lambda: batches(*args), index, window, out, go)


def _producer(serve: Callable[..., Any], args: tuple[Any, ...]) -> None:
    child_setup()
    serve(*args)


def throughput(batches: Batches, args: tuple[Any, ...], k: int, warmup: float, window: float,
               producer: Producer | None = None) -> tuple[float, dict[str, float]]:
    """Aggregate samples/s of ``k`` consumers ``batches(*args)`` over one common window, and where
    the time went (s): start-up to the last first batch, warm-up + window, teardown.

    ``producer`` is ``(serve, serve_args)``, run in its own process for the whole measurement.
    Raises RuntimeError if any consumer failed or a process died, rather than returning a count.
    """
    t0 = time.monotonic()
    results, go = CTX.Queue(), CTX.Queue()
    procs: list[Any] = [] if producer is None else [CTX.Process(target=_producer, args=producer)]
    procs += [CTX.Process(target=_consumer, args=(batches, args, i, window, results, go)) for i in range(k)]
    started: list[Any] = []
    samples: dict[int, int] = {}
    try:
        for p in procs:
            p.start()
            started.append(p)
        first = max(collect("first", procs, k, results, FIRST_BATCH_TIMEOUT_S + 60).values())
        begin = first + warmup
        for _ in range(k):
            go.put(begin)
        samples = collect("ok", procs, k, results, begin + window + 30 - time.monotonic())
        t_results = time.monotonic()
    finally:
        stop(started, consumers=procs[len(procs) - k:] if samples else [])
        for q in (results, go):
            q.close()
            q.join_thread()
    timing = {"start_to_first_batch": first - t0, "warmup_and_window": t_results - first,
              "teardown": time.monotonic() - t_results}
    return sum(samples.values()) / window, {key: round(v, 1) for key, v in timing.items()}
