"""Fixtures for the GPU layer: emulated state in a temp dir and real emulate-job processes."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from collocate.gpus.emulated import ENV_STATE_DIR, EmulatedBackend

from ._gpu_helpers import NODE


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    return tmp_path / "emu"


@pytest.fixture
def backend(state_dir: Path) -> EmulatedBackend:
    return EmulatedBackend.create(state_dir, "2xA100-40GB", node=NODE)


JobStarter = Callable[..., subprocess.Popen]


@pytest.fixture
def start_job(state_dir: Path) -> Iterator[JobStarter]:
    """Start `collocate emulate-job` as a real process; every process is reaped at teardown."""
    procs: list[subprocess.Popen] = []

    def start(*args: str, devices: str = f"GPU-emu-{NODE}-0", env: dict[str, str] | None = None):
        full_env = {**os.environ, ENV_STATE_DIR: str(state_dir), "CUDA_VISIBLE_DEVICES": devices}
        full_env.update(env or {})
        proc = subprocess.Popen(
            [sys.executable, "-m", "collocate.cli", "emulate-job", *args],
            env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=10)
