"""Faults with real processes: killed, stopped, stalled consumers and producers; no leftovers."""

from __future__ import annotations

import os
import signal
import time

import pytest
from _share_workers import consume, produce

from collocate.share import naming

N = 103


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:  # already gone (forkserver children are reaped by the server)
        pass


def _shm_entries() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def _wait_bound(name: str, state_dir: str, timeout: float = 20.0) -> None:
    address = naming.socket_address(name, state_dir)
    deadline = time.monotonic() + timeout
    while not naming.address_is_bound(address):
        assert time.monotonic() < deadline, "producer never bound its socket"
        time.sleep(0.05)


def test_sigkilled_consumer_is_reclaimed_and_the_others_go_on(procs, state_dir) -> None:
    # stall_timeout is long: only the dead socket can free the ring in time
    procs.start(produce, "kc", state_dir, N, 8, slots=4, stall_timeout_s=60.0, consumer_timeout_s=30.0)
    victim = procs.start(consume, "kc", state_dir, procs.queue, "victim", 8, 3, pause_at=2, pause_s=60.0)
    procs.ready("victim")
    procs.start(consume, "kc", state_dir, procs.queue, "other", 8, 3)
    procs.ready("other")
    time.sleep(1.0)  # the victim now sits on its slots and the other consumer is blocked behind it
    killed = time.monotonic()
    os.kill(victim.pid, signal.SIGKILL)
    results = procs.collect(["other"], timeout=20)["other"]
    assert results[-1][0] == "done", results[-1]
    assert time.monotonic() - killed < 10, "slots of a killed consumer must be reclaimed within seconds"
    assert all(sorted(ids) == list(range(N)) for kind, ids, _ in results if kind == "epoch")


def test_stalled_consumer_is_detached_with_a_clear_error(procs, state_dir) -> None:
    procs.start(produce, "st", state_dir, N, 8, slots=4, stall_timeout_s=1.0)
    procs.start(consume, "st", state_dir, procs.queue, "slow", 8, 2, pause_at=2, pause_s=5.0)
    procs.ready("slow")
    procs.start(consume, "st", state_dir, procs.queue, "fast", 8, 4)
    results = procs.collect(["slow", "fast"], timeout=40)
    assert results["fast"][-1][0] == "done", results["fast"][-1]
    slow = results["slow"][-1]
    assert slow[:2] == ("error", "ConsumerDetachedError"), slow
    assert "held batch" in slow[2] and "stall_timeout_s" in slow[2]


def test_unresponsive_consumer_is_detached_after_the_grace_period(procs, state_dir) -> None:
    procs.start(produce, "un", state_dir, N, 8, slots=4, consumer_timeout_s=1.0, stall_timeout_s=60.0)
    frozen = procs.start(consume, "un", state_dir, procs.queue, "frozen", 8, 50, sleep=0.02)
    procs.ready("frozen")
    procs.start(consume, "un", state_dir, procs.queue, "other", 8, 3)
    procs.ready("other")
    os.kill(frozen.pid, signal.SIGSTOP)  # no heartbeats any more
    try:
        results = procs.collect(["other"], timeout=20)["other"]
        assert results[-1][0] == "done", results[-1]
    finally:
        _signal(frozen.pid, signal.SIGCONT)
    error = procs.collect(["frozen"], timeout=20)["frozen"][-1]
    assert error[:2] == ("error", "ConsumerDetachedError") and "sent nothing" in error[2], error


def test_consumer_pausing_between_epochs_does_not_stall_the_rest(procs, state_dir) -> None:
    procs.start(produce, "pa", state_dir, N, 8, slots=4, stall_timeout_s=1.0)
    procs.start(consume, "pa", state_dir, procs.queue, "evaluator", 5, 2, between_epochs_s=2.5)
    procs.start(consume, "pa", state_dir, procs.queue, "trainer", 8, 6)
    results = procs.collect(["evaluator", "trainer"], timeout=40)
    for tag in ("evaluator", "trainer"):
        assert results[tag][-1][0] == "done", results[tag][-1]
        epochs = [ids for kind, ids, _ in results[tag] if kind == "epoch"]
        assert epochs and all(sorted(ids) == list(range(N)) for ids in epochs)


@pytest.mark.parametrize("how", ["sigkill", "sigstop"])
def test_consumers_fail_fast_when_the_producer_dies_or_hangs(procs, state_dir, how: str) -> None:
    before = _shm_entries()
    producer = procs.start(produce, "pd", state_dir, N, 8, slots=4, delay=0.05)
    for tag in ("a", "b"):
        procs.start(consume, "pd", state_dir, procs.queue, tag, 8, 50, timeout=1.5)
    procs.ready("a", "b")
    time.sleep(0.5)
    os.kill(producer.pid, signal.SIGKILL if how == "sigkill" else signal.SIGSTOP)
    hit = time.monotonic()
    try:
        results = procs.collect(["a", "b"], timeout=15)
        waited = time.monotonic() - hit
    finally:
        _signal(producer.pid, signal.SIGKILL)
    for tag in ("a", "b"):
        assert results[tag][-1][:2] == ("error", "ProducerLostError"), results[tag][-1]
    assert waited < 1.5 + 3.0, f"consumers took {waited:.1f} s to notice"
    producer.join(5)
    assert not naming.address_is_bound(naming.socket_address("pd", state_dir)), "socket name left behind"
    assert _shm_entries() <= before, "a shared-memory segment was left behind"
    assert not os.path.exists(state_dir), "the producer must not create files in the state directory"


def test_graceful_stop_tells_consumers_and_leaves_nothing(procs, state_dir) -> None:
    before = _shm_entries()
    producer = procs.start(produce, "gs", state_dir, N, 8, slots=4, delay=0.02)
    procs.start(consume, "gs", state_dir, procs.queue, "c", 8, 50)
    procs.ready("c")
    _wait_bound("gs", state_dir)
    os.kill(producer.pid, signal.SIGTERM)
    error = procs.collect(["c"], timeout=15)["c"][-1]
    assert error[:2] == ("error", "ProducerLostError") and "shutting down" in error[2], error
    producer.join(10)
    assert producer.exitcode == 0
    assert not naming.address_is_bound(naming.socket_address("gs", state_dir))
    assert _shm_entries() <= before
