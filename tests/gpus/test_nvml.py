"""The NVML backend against a fake of the pynvml functions (no GPU here), and its pure helpers."""

from __future__ import annotations

from types import SimpleNamespace

import pynvml
import pytest

from collocate.core.model import GpuId
from collocate.gpus.nvml import (
    NoGpuError,
    NvmlBackend,
    bytes_to_mib,
    gpm_values,
    merge_processes,
    millijoules_to_joules,
    milliwatts_to_watts,
    nvml_available,
    percent_to_fraction,
    type_name_from_product,
)

from .fake_nvml import FakeNvml


def test_no_driver_is_a_clear_error_naming_the_emulated_option() -> None:
    with pytest.raises(NoGpuError) as err:
        NvmlBackend(node="n")  # the real pynvml: this machine has no NVIDIA driver
    text = str(err.value)
    assert "no NVIDIA driver found" in text and "--gpus emulated:4xA100-40GB" in text
    with pytest.raises(NoGpuError, match="Driver Not Loaded"):
        NvmlBackend(node="n", nvml=FakeNvml(fail_init=pynvml.NVML_ERROR_DRIVER_NOT_LOADED))
    assert not nvml_available()
    assert not nvml_available(FakeNvml(fail_init=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND))
    assert nvml_available(FakeNvml())


@pytest.mark.parametrize(
    ("product", "ours"),
    [
        ("NVIDIA H100 80GB HBM3", "H100-80GB"),
        ("NVIDIA A100-SXM4-40GB", "A100-40GB"),
        ("NVIDIA A100-PCIE-40GB", "A100-40GB"),
        ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
        ("NVIDIA A100 80GB PCIe", "A100-80GB"),
        ("NVIDIA H200", "H200-141GB"),
        ("NVIDIA L4", "L4-24GB"),
        ("NVIDIA GeForce RTX 4090", "RTX4090-24GB"),
        ("NVIDIA A100-SXM4-40GB MIG 3g.20gb", "A100-40GB"),
        ("NVIDIA H100 PCIe", "NVIDIA H100 PCIe"),  # other SM count and power: kept as-is
        ("Tesla V100-SXM2-16GB", "Tesla V100-SXM2-16GB"),
    ],
)
def test_product_names_map_to_our_types(product: str, ours: str) -> None:
    assert type_name_from_product(product) == ours


def test_unit_conversions() -> None:
    assert bytes_to_mib(3 * 1024 * 1024) == 3.0
    assert milliwatts_to_watts(251_500) == 251.5
    assert millijoules_to_joules(1_000_500) == 1000.5
    assert percent_to_fraction(87) == 0.87 and percent_to_fraction(120) == 1.0
    assert bytes_to_mib(None) is None and milliwatts_to_watts(None) is None


def test_gpm_values_take_only_successful_metrics() -> None:
    metrics = [
        SimpleNamespace(metricId=pynvml.NVML_GPM_METRIC_SM_UTIL, nvmlReturn=pynvml.NVML_SUCCESS, value=50.0),
        SimpleNamespace(metricId=pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL, nvmlReturn=pynvml.NVML_ERROR_NOT_SUPPORTED,
                        value=99.0),
        SimpleNamespace(metricId=pynvml.NVML_GPM_METRIC_FP16_UTIL, nvmlReturn=pynvml.NVML_SUCCESS, value=7.0),
    ]
    assert gpm_values(pynvml, metrics) == {"sm_activity": 0.5, "sm_occupancy": None, "dram_activity": None}


def test_processes_merge_compute_and_mps_lists() -> None:
    mib = 1024 * 1024
    compute = [SimpleNamespace(pid=5, usedGpuMemory=100 * mib), SimpleNamespace(pid=6, usedGpuMemory=None)]
    mps = [SimpleNamespace(pid=5, usedGpuMemory=120 * mib)]
    merged = merge_processes(compute, mps, {5: 0.25})
    assert [(p.pid, p.used_mib, p.sm_util) for p in merged] == [(5, 120.0, 0.25), (6, 0.0, None)]


@pytest.fixture
def fake() -> FakeNvml:
    return FakeNvml()


def test_devices_whole_gpus_and_mig_instances(fake: FakeNvml) -> None:
    backend = NvmlBackend(node="box", nvml=fake)
    devices = backend.devices()
    assert [d.uuid for d in devices] == ["GPU-h100", "MIG-aaa", "MIG-bbb"]
    h100, three, four = devices
    assert (h100.id, h100.type_name, h100.sm_count, h100.total_mib) == (GpuId("box", 0), "H100-80GB", 132, 81_559)
    assert (three.id, three.mig_profile, three.parent_uuid, three.sm_count) == (
        GpuId("box", 1, "2.0"), "3g.20gb", "GPU-a100", 42)
    assert four.mig_profile == "4g.20gb" and four.type_name == "A100-40GB"


def test_sample_reads_metrics_and_leaves_unsupported_ones_none(fake: FakeNvml) -> None:
    backend = NvmlBackend(node="box", nvml=fake)
    first = backend.sample()
    h100, mig = first[0], first[1]
    assert h100.used_mib == 1000 and h100.free_mib == 80_559
    assert h100.gpu_util == 0.87 and h100.power_watts == 250.0
    assert h100.energy_joules == pytest.approx(1005.0)
    assert (h100.temperature_c, h100.sm_clock_mhz, h100.mem_clock_mhz) == (61.0, 1980.0, 2619.0)
    assert h100.sm_activity is None  # GPM needs two samples
    assert [(p.pid, p.used_mib, p.sm_util) for p in h100.processes] == [(111, 600.0, 0.4), (222, 300.0, None)]
    assert (mig.gpu_util, mig.power_watts, mig.energy_joules, mig.sm_activity) == (None, None, None, None)
    assert (mig.temperature_c, mig.sm_clock_mhz) == (None, None)  # per physical GPU only
    assert [(p.pid, p.used_mib) for p in mig.processes] == [(333, 5.0)]

    second = backend.sample()[0]
    assert second.sm_activity == 0.625 and second.sm_occupancy == 0.31 and second.dram_activity is None
    assert second.energy_joules > h100.energy_joules
    assert "procutil:GPU-h100:10" in fake.calls  # asks only for samples newer than the last

    caps = backend.capabilities()
    assert caps["memory"] == "ok" and caps["power"].startswith("GPU-h100: ok")
    assert "GPU-h100: ok" in caps["temperature"] and "MIG-aaa: not on MIG" in caps["sm_clock"]
    assert "MIG-aaa: unsupported" in caps["mps_processes"]
    assert caps["mig_mode"] == "GPU-a100: ok; GPU-h100: unsupported"
    assert "unsupported" in caps["gpm"] and "GPU-h100: ok" in caps["gpm"]
    backend.close()
    assert fake.calls.count("gpm_free") == 2 and fake.calls[-1] == "shutdown"


def test_no_gpus_is_a_clear_error(fake: FakeNvml) -> None:
    fake.gpus = []
    with pytest.raises(NoGpuError, match="found no NVIDIA GPU"):
        NvmlBackend(node="box", nvml=fake)
    assert fake.calls[-1] == "shutdown"


def test_unreadable_memory_reports_the_device_full(fake: FakeNvml) -> None:
    backend = NvmlBackend(node="box", nvml=fake)

    def broken(handle: object) -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)

    fake.nvmlDeviceGetMemoryInfo = broken  # type: ignore[method-assign]
    s = backend.sample()[0]
    assert (s.used_mib, s.free_mib) == (81_559, 0.0)
    assert backend.capabilities()["memory"].startswith("error:")


def test_driver_versions_reads_driver_cuda_and_device_name():
    from types import SimpleNamespace

    from collocate.gpus.nvml import driver_versions

    calls = []
    fake = SimpleNamespace(
        nvmlInit=lambda: calls.append("init"),
        nvmlShutdown=lambda: calls.append("shutdown"),
        nvmlSystemGetDriverVersion=lambda: b"570.86.15",
        nvmlSystemGetCudaDriverVersion=lambda: 12080,
        nvmlDeviceGetHandleByIndex=lambda i: ("handle", i),
        nvmlDeviceGetName=lambda h: "NVIDIA H100 80GB HBM3",
    )
    assert driver_versions(0, fake) == {
        "device_name": "NVIDIA H100 80GB HBM3", "driver": "570.86.15", "cuda_driver": "12.8"}
    assert calls == ["init", "shutdown"]


def test_driver_versions_without_a_driver_are_unknown():
    from types import SimpleNamespace

    from collocate.gpus.nvml import driver_versions

    def fail():
        raise RuntimeError("NVML Shared Library Not Found")

    assert driver_versions(0, SimpleNamespace(nvmlInit=fail)) == {
        "device_name": None, "driver": None, "cuda_driver": None}
