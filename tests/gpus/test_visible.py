"""The NVML backend keeps only the GPUs a job scheduler gave us: the rule on plain data, then
through the backend with the fake NVML (GPU 0 an H100, GPU 1 an A100 in MIG mode with MIG-aaa
and MIG-bbb)."""

from __future__ import annotations

from pathlib import Path

import pytest

from collocate.common.errors import InputError
from collocate.core.model import GpuId
from collocate.gpus.base import DeviceInfo
from collocate.gpus.nvml import NvmlBackend
from collocate.gpus.registry import open_backend
from collocate.gpus.visible import Visible, select_devices, visible_from_env

from .fake_nvml import FakeNvml

DEVICES = [
    DeviceInfo(GpuId("n", 0), "GPU-h100", "H100-80GB", 81_559, 132),
    DeviceInfo(GpuId("n", 1, "2.0"), "MIG-aaa", "A100-40GB", 19_968, 42, parent_uuid="GPU-a100"),
    DeviceInfo(GpuId("n", 1, "1.0"), "MIG-bbb", "A100-40GB", 19_968, 56, parent_uuid="GPU-a100"),
    DeviceInfo(GpuId("n", 2), "GPU-l4", "L4-24GB", 22_491, 58),
]


def uuids(devices: list[DeviceInfo]) -> list[str]:
    return [d.uuid for d in devices]


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, None),
        ({"SLURM_JOB_GPUS": "2,3"}, Visible("SLURM_JOB_GPUS", ("2", "3"))),
        ({"SLURM_JOB_GPUS": "0,1,2,3", "SLURM_STEP_GPUS": "3"}, Visible("SLURM_STEP_GPUS", ("3",))),
        (  # Slurm's cgroup-relative CUDA_VISIBLE_DEVICES wins over its global indices
            {"SLURM_JOB_GPUS": "2,3", "SLURM_STEP_GPUS": "2,3", "CUDA_VISIBLE_DEVICES": "0,1"},
            Visible("CUDA_VISIBLE_DEVICES", ("0", "1")),
        ),
        ({"CUDA_VISIBLE_DEVICES": " 1, GPU-h100 ,MIG-aaa,"},
         Visible("CUDA_VISIBLE_DEVICES", ("1", "GPU-h100", "MIG-aaa"))),
    ],
)
def test_which_variable_wins_and_how_it_is_read(env: dict[str, str], expected: Visible | None) -> None:
    assert visible_from_env(env) == expected


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"CUDA_VISIBLE_DEVICES": ""}, "CUDA_VISIBLE_DEVICES is set but empty"),
        ({"SLURM_JOB_GPUS": " , "}, "SLURM_JOB_GPUS is set but empty"),
        ({"CUDA_VISIBLE_DEVICES": "-1"}, "'-1' is not a GPU index"),
        ({"CUDA_VISIBLE_DEVICES": "0,NoDevFiles", "SLURM_JOB_GPUS": "0"}, "'NoDevFiles' is not"),
    ],
)
def test_unreadable_variables_are_errors(env: dict[str, str], message: str) -> None:
    with pytest.raises(InputError, match=message):
        visible_from_env(env)


@pytest.mark.parametrize(
    ("entries", "kept"),
    [
        (("2",), ["GPU-l4"]),
        (("1",), ["MIG-aaa", "MIG-bbb"]),  # an index of a GPU in MIG mode: all its instances
        (("GPU-a100",), ["MIG-aaa", "MIG-bbb"]),  # so does its GPU UUID
        (("MIG-bbb",), ["MIG-bbb"]),  # a MIG UUID: that instance only
        (("2", "MIG-aaa", "GPU-h100"), ["GPU-h100", "MIG-aaa", "GPU-l4"]),  # mixed; NVML's order
        (("0", "GPU-h100"), ["GPU-h100"]),  # named twice, kept once
    ],
)
def test_selection_on_plain_devices(entries: tuple[str, ...], kept: list[str]) -> None:
    assert uuids(select_devices(Visible("CUDA_VISIBLE_DEVICES", entries), DEVICES)) == kept


def test_no_restriction_keeps_every_device() -> None:
    assert select_devices(None, DEVICES) == DEVICES


def test_a_missing_gpu_names_the_variable_and_what_nvml_sees() -> None:
    with pytest.raises(InputError) as err:
        select_devices(Visible("CUDA_VISIBLE_DEVICES", ("0", "7", "GPU-gone")), DEVICES)
    text = str(err.value)
    assert "CUDA_VISIBLE_DEVICES names 7, GPU-gone, which NVML does not see" in text
    assert "0 GPU-h100" in text and "1 MIG-aaa (on GPU-a100)" in text and "2 GPU-l4" in text
    assert "ConstrainDevices" not in text
    # Slurm's global indices under a device cgroup: the hint says to use CUDA_VISIBLE_DEVICES
    with pytest.raises(InputError, match="ConstrainDevices=yes.*set CUDA_VISIBLE_DEVICES"):
        select_devices(Visible("SLURM_JOB_GPUS", ("4", "5")), DEVICES[:1])


def test_backend_lists_and_samples_only_the_allowed_devices() -> None:
    fake = FakeNvml()
    backend = NvmlBackend(node="box", nvml=fake, visible=Visible("SLURM_STEP_GPUS", ("1",)))
    devices = backend.devices()
    # GpuId keeps NVML's index; jobs get the UUID in CUDA_VISIBLE_DEVICES, the same GPU either way
    assert [(d.id, d.uuid) for d in devices] == [
        (GpuId("box", 1, "2.0"), "MIG-aaa"), (GpuId("box", 1, "1.0"), "MIG-bbb")]
    assert [s.uuid for s in backend.sample()] == ["MIG-aaa", "MIG-bbb"]
    assert not any(c.startswith("procutil:GPU-h100") for c in fake.calls)  # the H100 is not read
    one = NvmlBackend(node="box", nvml=FakeNvml(), visible=Visible("CUDA_VISIBLE_DEVICES",
                                                                   ("MIG-bbb", "GPU-h100")))
    assert uuids(one.devices()) == ["GPU-h100", "MIG-bbb"]


def test_backend_with_a_gpu_nvml_lacks_fails_and_shuts_nvml_down() -> None:
    fake = FakeNvml()
    with pytest.raises(InputError, match="CUDA_VISIBLE_DEVICES names 3, which NVML does not see"):
        NvmlBackend(node="box", nvml=fake, visible=Visible("CUDA_VISIBLE_DEVICES", ("0", "3")))
    assert fake.calls[-1] == "shutdown"


def test_open_backend_reads_the_restriction_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(InputError, match="CUDA_VISIBLE_DEVICES is set but empty"):
        open_backend("nvml", state_dir=tmp_path, node="n")  # read before NVML starts
    # the emulated backend ignores it: its GPUs are not the node's (see docs/gpus.md)
    assert len(open_backend("emulated:2xA100-40GB", state_dir=tmp_path, node="n").devices()) == 2
