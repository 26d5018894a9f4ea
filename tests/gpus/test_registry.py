from __future__ import annotations

import json
from pathlib import Path

import pytest

from collocate.common.errors import InputError, UnknownNameError
from collocate.gpus.emulated import EmulatedBackend
from collocate.gpus.nvml import NoGpuError
from collocate.gpus.probe import main
from collocate.gpus.registry import BACKENDS, emulated_state_dir, open_backend


def test_emulated_spec_opens_in_the_state_dir(tmp_path: Path) -> None:
    backend = open_backend("emulated:4xA100-40GB", state_dir=tmp_path, node="box")
    assert isinstance(backend, EmulatedBackend) and backend.name == "emulated"
    assert [d.uuid for d in backend.devices()] == [f"GPU-emu-box-{i}" for i in range(4)]
    assert (emulated_state_dir(tmp_path) / "emulated.sqlite").exists()
    backend.close()


def test_unknown_backend_lists_valid_names(tmp_path: Path) -> None:
    with pytest.raises(UnknownNameError) as err:
        open_backend("cuda", state_dir=tmp_path, node="box")
    assert all(name in str(err.value) for name in BACKENDS)


@pytest.mark.parametrize("spec", ["auto", "nvml"])
def test_no_gpu_says_how_to_use_emulated_gpus(tmp_path: Path, spec: str) -> None:
    with pytest.raises(NoGpuError) as err:
        open_backend(spec, state_dir=tmp_path, node="box")
    assert "--gpus emulated:4xA100-40GB" in str(err.value)
    assert "no GPU found" in str(err.value) or "no NVIDIA driver" in str(err.value)


@pytest.mark.parametrize(
    ("spec", "message"),
    [("emulated:", "need a spec"), ("emulated:4xB999", "unknown GPU type"), ("nvml:0", "takes no argument"),
     ("emulated:four", "cannot read cluster spec")],
)
def test_bad_specs(tmp_path: Path, spec: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        open_backend(spec, state_dir=tmp_path, node="box")


def test_probe_prints_devices_samples_and_capabilities(tmp_path: Path, capsys) -> None:
    assert main(["--gpus", "emulated:1xH100-80GB:mig0=3g.40gb", "--interval", "0",
                 "--state-dir", str(tmp_path)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["backend"] == "emulated" and report["capabilities"] is None
    assert report["devices"][0]["mig_profile"] == "3g.40gb" and len(report["samples"]) == 2
    assert main(["--gpus", "nvml"]) == 2
    assert "--gpus emulated:4xA100-40GB" in capsys.readouterr().err
