from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from collocate.common.errors import CollocateError, InputError
from collocate.gpus.mps import (
    CONTROL_BINARY,
    MpsControl,
    MpsDirs,
    active_thread_percentage,
    mps_client_env,
    pinned_mem_limit,
)


@pytest.mark.parametrize(("share", "pct"), [(0.5, 50), (0.333, 34), (0.001, 1), (0.0, 1), (-3, 1), (1.0, 100), (2.5, 100)])
def test_active_thread_percentage_is_clamped(share: float, pct: int) -> None:
    assert active_thread_percentage(share) == pct


def test_pinned_limit_adds_the_margin_and_rounds_up() -> None:
    assert pinned_mem_limit(4096) == "0=4608M"
    assert pinned_mem_limit(1000.2, margin_mib=0) == "0=1001M"
    assert pinned_mem_limit(2048, ["0", "1"], margin_mib=256) == "0=2304M,1=2304M"
    with pytest.raises(InputError):
        pinned_mem_limit(0)
    with pytest.raises(InputError):
        active_thread_percentage(float("nan"))


def test_client_env(tmp_path: Path) -> None:
    dirs = MpsDirs.under(tmp_path)
    env = mps_client_env(dirs=dirs, sm_share=0.25, mem_mib=3072)
    assert env == {
        "CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "mps" / "pipe"),
        "CUDA_MPS_LOG_DIRECTORY": str(tmp_path / "mps" / "log"),
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=3584M",
    }
    assert set(mps_client_env(dirs=dirs)) == {"CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY"}


def test_start_without_the_binary_names_it(tmp_path: Path) -> None:
    control = MpsControl(tmp_path, base_env={"PATH": str(tmp_path)})  # the real lookup: absent here
    with pytest.raises(CollocateError) as err:
        control.start()
    assert CONTROL_BINARY in str(err.value) and "not installed" in str(err.value)


class FakeRunner:
    def __init__(self, returncode: int = 0, stderr: str = "") -> None:
        self.calls: list[tuple[list[str], dict]] = []
        self.returncode, self.stderr = returncode, stderr

    def __call__(self, argv: list[str], **kwargs: object) -> subprocess.CompletedProcess:
        self.calls.append((argv, dict(kwargs)))
        return subprocess.CompletedProcess(argv, self.returncode, "", self.stderr)


def test_start_and_stop_use_argv_lists_and_the_state_dirs(tmp_path: Path) -> None:
    runner = FakeRunner()
    control = MpsControl(tmp_path, runner=runner, which=lambda b: f"/opt/bin/{b}",
                         base_env={"CUDA_VISIBLE_DEVICES": "1", "HOME": "/h"})
    control.start()
    control.stop()
    (start_argv, start_kw), (stop_argv, stop_kw) = runner.calls
    assert start_argv == [f"/opt/bin/{CONTROL_BINARY}", "-d"] and start_kw["input"] is None
    assert stop_argv == [f"/opt/bin/{CONTROL_BINARY}"] and stop_kw["input"] == "quit\n"
    env = start_kw["env"]
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == str(tmp_path / "mps" / "pipe") and env["HOME"] == "/h"
    assert "CUDA_VISIBLE_DEVICES" not in env
    assert (tmp_path / "mps" / "pipe").is_dir() and (tmp_path / "mps" / "log").is_dir()
    assert "shell" not in start_kw


def test_a_failing_control_daemon_reports_status_and_logs(tmp_path: Path) -> None:
    control = MpsControl(tmp_path, runner=FakeRunner(1, "An instance of this daemon is already running"),
                         which=lambda b: b)
    with pytest.raises(CollocateError) as err:
        control.start()
    text = str(err.value)
    assert "status 1" in text and "already running" in text and str(tmp_path / "mps" / "log") in text


def test_the_default_sharing_is_mps_for_one_users_daemon_where_mps_can_run():
    from collocate.gpus.mps import default_sharing

    found = {"nvidia-cuda-mps-control": "/usr/bin/nvidia-cuda-mps-control"}.get
    assert default_sharing(gpus="nvml", serves_others=False, ray=False, which=found)[0] == "mps"
    assert default_sharing(gpus="emulated:2xA100-40GB", serves_others=False, ray=False,
                           which=lambda name: None)[0] == "mps"
    mode, why = default_sharing(gpus="nvml", serves_others=False, ray=False, which=lambda name: None)
    assert mode == "time-slicing" and "not installed" in why
    mode, why = default_sharing(gpus="nvml", serves_others=True, ray=False, which=found)
    assert mode == "time-slicing" and "group" in why  # MPS would serialise members' jobs
    assert default_sharing(gpus="nvml", serves_others=False, ray=True, which=found)[0] == "time-slicing"
