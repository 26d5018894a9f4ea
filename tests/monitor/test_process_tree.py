"""Process-tree readings: descendants are included, CPU deltas are real, gone roots are empty."""

from __future__ import annotations

import subprocess
import sys
import time

from collocate.monitor.process_tree import EMPTY, TreeReader, descendants

PARENT_WITH_BUSY_CHILD = """
import subprocess, sys, time
BUSY = ('import time\\nt = time.process_time()\\n'
        'while time.process_time() - t < 0.6: pass\\ntime.sleep(60)')
child = subprocess.Popen([sys.executable, '-c', BUSY])
print(child.pid, flush=True)
time.sleep(60)
"""


def test_descendants_cut_cycles():
    assert descendants(1, {1: [2, 3], 2: [4], 4: [1]}) == {1, 2, 3, 4}


def test_tree_includes_children_and_counts_their_cpu():
    proc = subprocess.Popen([sys.executable, "-c", PARENT_WITH_BUSY_CHILD], stdout=subprocess.PIPE,
                            text=True)
    try:
        child = int(proc.stdout.readline())
        reader = TreeReader()
        first = reader.read({"j": proc.pid}, time.time())["j"]
        assert {proc.pid, child} <= first.pids
        assert first.rss_mib > 5
        total_cpu, deadline = first.cpu_s, time.monotonic() + 20
        while total_cpu < 0.6 and time.monotonic() < deadline:  # the machine may be loaded
            time.sleep(0.2)
            second = reader.read({"j": proc.pid}, time.time())["j"]
            total_cpu += second.cpu_s
            assert second.cpu_percent >= 0
        # the child's 0.6 s busy loop plus two interpreter start-ups, counted once
        assert 0.6 <= total_cpu < 3.0
    finally:
        proc.kill()
        proc.wait()
        subprocess.run(["kill", "-9", str(child)], check=False)


def test_gone_root_reads_empty_and_is_forgotten():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    reader = TreeReader()
    assert reader.read({"gone": proc.pid}, time.time())["gone"] == EMPTY
    assert reader.read({}, time.time()) == {}
