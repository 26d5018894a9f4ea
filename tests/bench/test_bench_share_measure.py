"""The shared-loading benchmarks' common-window measurement (benchmarks/_share_measure.py) and how
share_cpu.py records a failed measurement: null plus the reason, never a number."""

from __future__ import annotations

import importlib
import queue
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))  # as the scripts do; children inherit it
measure = importlib.import_module("_share_measure")
share_cpu = importlib.import_module("share_cpu")


class _Proc:
    def __init__(self, exitcode: int | None) -> None:
        self.exitcode = exitcode


class _Queue:
    def __init__(self, *messages: tuple) -> None:
        self.messages = list(messages)

    def get(self, timeout: float) -> tuple:
        if not self.messages:
            raise queue.Empty
        return self.messages.pop(0)


def test_collect_turns_failures_into_errors() -> None:
    live = [_Proc(None), _Proc(None), _Proc(None)]  # producer, two consumers
    assert measure.collect("ok", live, 2, _Queue(("ok", 1, 64), ("ok", 0, 32)), 5) == {0: 32, 1: 64}
    with pytest.raises(RuntimeError, match="consumer 0: no batch within 60 s"):
        measure.collect("first", live, 2, _Queue(("error", 0, "no batch within 60 s")), 5)
    with pytest.raises(RuntimeError, match=r"exit codes \[1, None, None\]"):  # the producer died
        measure.collect("first", [_Proc(1), _Proc(None), _Proc(None)], 2, _Queue(), 5)
    with pytest.raises(RuntimeError, match=r"no 'ok' from consumers \[0, 1\]"):
        measure.collect("ok", live, 2, _Queue(), 0)
    # a consumer that reported exits 0; a producer that exits at all, or a consumer that dies, is an error
    with pytest.raises(RuntimeError, match=r"exit codes \[0, None, None\]"):
        measure.collect("ok", [_Proc(0), _Proc(None), _Proc(None)], 2, _Queue(), 5)
    with pytest.raises(RuntimeError, match=r"exit codes \[None, 0, 1\]"):
        measure.collect("ok", [_Proc(None), _Proc(0), _Proc(1)], 2, _Queue(("ok", 0, 32)), 5)


@pytest.mark.slow
def test_a_consumer_that_raises_or_a_dead_producer_is_an_error_not_a_count() -> None:
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=r"consumer 0: ValueError"):
        measure.throughput(int, ("not a batch",), 1, 0.1, 0.5)  # the consumer's iterator raises at once
    with pytest.raises(RuntimeError, match="exited while waiting for 'first'"):
        measure.throughput(time.sleep, (60,), 1, 0.1, 0.5, producer=(int, ("x",)))  # producer exits 1
    assert time.monotonic() - t0 < 40  # neither waits out the first-batch timeout


def test_share_cpu_records_a_failed_measurement_as_null_with_its_reason() -> None:
    samples = {"single": [1000.0, 1100.0], "independent/K=2": [900.0, 950.0], "share/K=2": [1900.0, None],
               "tensorsocket/K=2": [None, None], "light-share/K=2": [9e4, 8e4], "light-tensorsocket/K=2": [None, 1200.0]}
    errors = {"share/K=2": "round 2: RuntimeError('consumer 1: DataLoader worker 7 exited with code -9')",
              "tensorsocket/K=2": "round 1: RuntimeError('consumer 1: no batch within 60 s'); round 2: same",
              "light-tensorsocket/K=2": "round 1: RuntimeError('x')"}
    rows, light = share_cpu.summarize(samples, errors, [2], ["independent", "share", "tensorsocket"])
    (row,) = rows
    assert row["tensorsocket"] is None and "no batch within 60 s" in row["tensorsocket_error"]
    assert row["share"] == 1900.0 and "worker 7" in row["share_error"]  # the run that worked, and why one did not
    assert row["single_T1"] == 1050.0 and "single_T1_error" not in row and "independent_error" not in row
    assert row["share_over_tensorsocket"] is None
    assert light == {"share": 85000.0, "tensorsocket": 1200.0, "tensorsocket_error": "round 1: RuntimeError('x')"}

    result = {"date": "2026-01-01", "settings": {"rounds": 2, "workers": 4}, "throughput": rows,
              "light_pipeline_K2": light, "all_measurements": samples, "errors": errors, "transport": [],
              "machine": {"cpu_model": "test", "cores": 2, "device": "cpu", "torch": "test",
                          "load_average_at_start": [0.0, 0.0, 0.0]}}
    md = share_cpu.markdown(result)
    table_row = next(line for line in md.splitlines() if line.startswith("| 2 |"))
    assert table_row.split(" | ")[3:5] == ["1900 [1]", "error [2]"]
    assert "- [2] (c) tensorsocket, K = 2: round 1: RuntimeError('consumer 1: no batch within 60 s')" in md
    assert "| 85000 | 1200 [3] |" in md and "- [3] light, (c) tensorsocket: round 1: RuntimeError('x')" in md
    assert "tensorsocket/K=2: error, error" in md
