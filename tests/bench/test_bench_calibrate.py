"""Calibration recovers known parameters from synthetic data and writes a loadable model."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from collocate.bench.calibrate import calibrate, interference_toml, profiles_toml
from collocate.bench.fit import fit_mode, fit_power, split_groups
from collocate.cli import app
from collocate.errors import InputError
from collocate.interference import load_interference
from collocate.model import SharingMode

from ._records import POWER, PROFILES, TRUE, synthetic_records


def _close(fitted, true, tol):
    for field in ("base", "per_sm", "per_dram", "saturation_exponent"):
        assert getattr(fitted, field) == pytest.approx(getattr(true, field), abs=tol), field


def test_recovers_known_parameters_exactly_without_noise() -> None:
    cal = calibrate(synthetic_records(), source="synthetic.jsonl", holdout=0.3, seed=1)
    for mode, true in TRUE.items():
        _close(cal.fits[mode].params, true, 1e-3)
        assert cal.fits[mode].exponent_identified
        stats = cal.stats[mode]
        assert stats["holdout_mixes"] and stats["holdout"]["n"] > 0
        assert stats["holdout"]["max_abs_error"] < 1e-3
    power = cal.power["H100-80GB"]
    assert (power.idle_watts, power.max_watts, power.exponent) == pytest.approx(POWER, rel=1e-3)
    assert cal.profiles["resnet152"].sm == PROFILES["resnet152"][0]


def test_recovers_parameters_within_tolerance_with_noise() -> None:
    cal = calibrate(synthetic_records(noise=0.01, seed=3), source="noisy", holdout=0.3)
    for mode, true in TRUE.items():
        _close(cal.fits[mode].params, true, 0.05)
        assert cal.stats[mode]["holdout"]["median_abs_error"] < 0.05


def test_written_model_loads_and_keeps_unmeasured_modes(tmp_path: Path) -> None:
    records = [r for r in synthetic_records() if r["sharing"] != "mps"]
    cal = calibrate(records, source="ts-only.jsonl")
    path = tmp_path / "interference.toml"
    path.write_text(interference_toml(cal))
    model = load_interference(path)
    ts = model.modes[SharingMode.TIME_SLICING]
    assert ts.per_sm == pytest.approx(TRUE["time-slicing"].per_sm, abs=1e-3)
    assert model.power_exponent == pytest.approx(POWER[2], abs=1e-2)
    doc = tomllib.loads(path.read_text())
    assert doc["calibration"]["device"] == "NVIDIA H100 80GB HBM3"
    assert doc["calibration"]["source"] == "ts-only.jsonl"
    assert "not measured" in doc["modes"]["mps"]["provenance"]
    assert "never changes MIG" in doc["modes"]["mig"]["provenance"]
    assert doc["power"]["gpus"]["H100-80GB"]["idle_watts"] == pytest.approx(POWER[0], rel=1e-3)
    assert any("mps" in n for n in cal.notes)
    profiles = tomllib.loads(profiles_toml(cal))["models"]
    assert profiles["dlrm"] == {"sm": 0.05, "dram": 0.1, "family": "dlrm"}


def test_without_gpm_profiles_it_says_what_is_missing() -> None:
    records = synthetic_records()
    for r in records:
        r["gpu"].pop("sm_activity", None)
    with pytest.raises(InputError, match="SM and DRAM activity"):
        calibrate(records, source="x")


def test_exponent_not_identifiable_keeps_prior() -> None:
    from collocate.bench.fit import Observation, predict
    from collocate.interference import ModeParams

    p = ModeParams(base=0.1, per_sm=0.2, per_dram=0.0)
    obs = []
    for k, (a, o) in enumerate([(0.1, 0.2), (0.2, 0.3), (0.3, 0.1), (0.4, 0.4)]):
        base = Observation(a, 0.1, o, 0.1, 0.0, str(k))
        obs.append(Observation(a, 0.1, o, 0.1, float(predict(p, [base])[0]), str(k)))
    fit = fit_mode(obs)
    assert not fit.exponent_identified and fit.params.saturation_exponent == 1.0
    assert fit.params.per_sm == pytest.approx(0.2, abs=1e-6)


def test_power_fit_and_split_edge_cases() -> None:
    with pytest.raises(ValueError):
        fit_power([0.5, 0.5], [100.0, 100.0])
    assert split_groups(["a", "b"], holdout=0.5, seed=0) == ({"a", "b"}, set())
    train, held = split_groups(list("abcdefgh"), holdout=0.25, seed=0)
    assert len(held) == 2 and not train & held and train | held == set("abcdefgh")


def test_cli_calibrate(tmp_path: Path) -> None:
    results = tmp_path / "results.jsonl"
    results.write_text("".join(json.dumps(r) + "\n" for r in synthetic_records()))
    out = tmp_path / "fitted.toml"
    res = CliRunner().invoke(app, ["bench", "calibrate", str(tmp_path), "--out", str(out),
                                   "--profiles-out", str(tmp_path / "p.toml"),
                                   "--report", str(tmp_path / "cal.md")])
    assert res.exit_code == 0, res.output
    assert "held-out" in res.output and "time-slicing" in res.output
    load_interference(out)
    assert (tmp_path / "cal.md").read_text().startswith("# Interference model calibration")


def test_cpu_rehearsal_results_are_refused() -> None:
    records = [{**r, "env": {"measured_on": "cpu"}} for r in synthetic_records()]
    with pytest.raises(InputError, match="CPU rehearsal"):
        calibrate(records, source="cpu.jsonl")
