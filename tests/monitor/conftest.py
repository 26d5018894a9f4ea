"""Fixtures: emulated GPUs in a temp dir and real sleeping processes holding emulated memory."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from collocate.gpus.emulated import EmulatedBackend
from collocate.gpus.emulated_state import process_start_time

NODE = "testnode"


@pytest.fixture
def backend(tmp_path: Path) -> EmulatedBackend:
    return EmulatedBackend.create(tmp_path / "emu", "2xA100-40GB", node=NODE)


Claimer = Callable[..., subprocess.Popen]


@pytest.fixture
def claimer(backend: EmulatedBackend) -> Iterator[Claimer]:
    """Start a real sleeping process and give it an emulated claim (as emulate-job would)."""
    procs: list[subprocess.Popen] = []

    def start(gpu: int, mib: float, sm: float, *, code: str = "import time; time.sleep(60)"):
        proc = subprocess.Popen([sys.executable, "-c", code])
        procs.append(proc)
        started = process_start_time(proc.pid)
        assert started is not None
        refusal = backend.store.claim(f"GPU-emu-{NODE}-{gpu}", proc.pid, started, mib, sm, 0.1)
        assert refusal is None
        return proc

    yield start
    for proc in procs:
        proc.kill()
        proc.wait(timeout=10)
