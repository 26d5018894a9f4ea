"""Calibration recovers known parameters from synthetic data and writes a loadable model."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from collocate.bench.calibrate import (
    calibrate,
    interference_toml,
    profiles_toml,
    report_markdown,
)
from collocate.bench.fit import (
    Observation,
    cross_validate,
    errors,
    fit_mode,
    fit_power,
    predict,
)
from collocate.cli import app
from collocate.common.errors import InputError
from collocate.core.interference import ModeParams, load_interference
from collocate.core.model import SharingMode

from ._records import POWER, PROFILES, TRUE, _power, synthetic_records


def _close(fitted, true, tol):
    for field in ("base", "per_sm", "per_dram", "saturation_exponent"):
        assert getattr(fitted, field) == pytest.approx(getattr(true, field), abs=tol), field


def test_recovers_known_parameters_exactly_without_noise() -> None:
    cal = calibrate(synthetic_records(), source="synthetic.jsonl")
    for mode, true in TRUE.items():
        _close(cal.fits[mode].params, true, 1e-3)
        assert cal.fits[mode].exponent_identified
        stats = cal.stats[mode]
        # every job is predicted once, by the fit on the other mixes
        assert stats["cv"]["n"] == stats["observations"] and stats["mixes"] == 14
        assert stats["cv"]["max_abs_error"] < 1e-6
        assert stats["cv"]["max_rel_error"] < 1e-6
    power = cal.power["H100-80GB"]
    assert (power.idle_watts, power.max_watts, power.exponent) == pytest.approx(POWER, rel=1e-3)
    assert cal.profiles["resnet152"].sm == PROFILES["resnet152"][0]


def test_recovers_parameters_within_tolerance_with_noise() -> None:
    cal = calibrate(synthetic_records(noise=0.01, seed=3), source="noisy")
    for mode, true in TRUE.items():
        _close(cal.fits[mode].params, true, 0.05)
        cv, insample = cal.stats[mode]["cv"], cal.stats[mode]["all"]
        assert cv["median_rel_error"] < 0.03  # 1% noise: the out-of-fold error stays near it
        assert insample["median_rel_error"] <= cv["median_rel_error"] + 1e-12
        assert cv["median_rel_error"] <= cv["p90_rel_error"] <= cv["max_rel_error"]


def test_errors_by_hand() -> None:
    e = errors([2.0, 1.1, 3.0], [1.6, 1.0, 3.0])  # relative 0.25, 0.1, 0; absolute 0.4, 0.1, 0
    assert e["n"] == 3
    assert e["median_rel_error"] == pytest.approx(0.1)
    assert e["p90_rel_error"] == pytest.approx(0.1 + 0.8 * 0.15)  # rank 1.8 of 0, 0.1, 0.25
    assert e["max_rel_error"] == pytest.approx(0.25)
    assert e["median_abs_error"] == pytest.approx(0.1)
    assert e["max_abs_error"] == pytest.approx(0.4)
    assert e["mean_abs_error"] == pytest.approx(0.5 / 3)
    with pytest.raises(ValueError):
        errors([], [])


def _obs(params: ModeParams, rows, groups) -> list[Observation]:
    out = []
    for (sm, dram, osm, odram), g in zip(rows, groups, strict=True):
        probe = Observation(sm, dram, osm, odram, 0.0, g)
        out.append(Observation(sm, dram, osm, odram, float(predict(params, [probe])[0]), g))
    return out


def test_cross_validation_predicts_each_mix_from_the_others() -> None:
    rng = np.random.default_rng(0)
    rows = rng.uniform(0.1, 0.9, size=(12, 4))
    obs = _obs(ModeParams(0.05, 0.2, 0.1, 1.2), rows, [str(k // 2) for k in range(12)])
    # one mix measured 30% slower than the model says: only its own prediction misses
    obs[:2] = [Observation(o.sm, o.dram, o.other_sm, o.other_dram, 1.3 * o.slowdown, o.group)
               for o in obs[:2]]
    oof = cross_validate(obs)
    rest = fit_mode(obs[2:]).params
    assert oof[:2] == pytest.approx(predict(rest, obs[:2]), abs=1e-9)
    assert errors(oof[:2], [o.slowdown for o in obs[:2]])["median_rel_error"] == pytest.approx(
        0.3 / 1.3, abs=1e-3)
    with pytest.raises(ValueError, match="3 mixes"):
        cross_validate(obs[:4])


def test_fit_keeps_per_sm_non_negative() -> None:
    """Data the unconstrained solve would give a negative per_sm: the fit is the best solution
    with per_sm = 0, found by brute force over (base, per_dram)."""
    rng = np.random.default_rng(1)
    rows = rng.uniform(0.05, 0.45, size=(10, 4))  # never over-subscribed: exponent stays 1
    obs = _obs(ModeParams(0.3, 0.0, 0.4), rows, [str(k) for k in range(10)])
    obs = [Observation(o.sm, o.dram, o.other_sm, o.other_dram,
                       o.slowdown - 0.3 * o.other_sm, o.group) for o in obs]
    fit = fit_mode(obs)
    assert fit.params.per_sm == 0.0
    x = np.column_stack([np.ones(10), rows[:, 3]])
    (base, per_dram), *_ = np.linalg.lstsq(x, [o.slowdown - 1 for o in obs], rcond=None)
    assert (fit.params.base, fit.params.per_dram) == pytest.approx((base, per_dram), abs=1e-9)
    residual = predict(fit.params, obs) - [o.slowdown for o in obs]
    assert fit.rmse == pytest.approx(float(np.sqrt(np.mean(residual**2))))


def test_power_is_fitted_against_measured_sm_activity() -> None:
    """The realized SM activity of a mix is below the sum of its jobs' solo activities; power
    follows the realized one, and the fit must use it to recover the curve."""
    records = synthetic_records()
    for r in records:
        if r["kind"] in ("mix", "copies"):
            realized = 0.8 * min(1.0, sum(PROFILES[w][0] for w in r["workloads"]))
            r["gpu"]["sm_activity"], r["gpu"]["power_watts"] = realized, _power(realized)
    cal = calibrate(records, source="realized.jsonl")
    power = cal.power["H100-80GB"]
    assert (power.idle_watts, power.max_watts, power.exponent) == pytest.approx(POWER, rel=1e-3)
    assert power.rmse < 1e-6
    assert cal.idle_reading_watts == POWER[0]
    assert "measured idle reading 70 W" in report_markdown(cal)
    doc = tomllib.loads(interference_toml(cal))
    assert doc["power"]["gpus"]["H100-80GB"]["idle_watts_measured"] == POWER[0]


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
    assert "never changes MIG" in doc["mig"]["provenance"]
    assert doc["power"]["gpus"]["H100-80GB"]["idle_watts"] == pytest.approx(POWER[0], rel=1e-3)
    assert any("mps" in n for n in cal.notes)
    errs = doc["calibration"]["modes"]["time-slicing"]
    assert errs["cv_max_rel_error"] < 1e-3 and "cv_p90_rel_error" in errs
    assert "leave-one-mix-out relative error" in doc["modes"]["time-slicing"]["provenance"]
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
    from collocate.core.interference import ModeParams

    p = ModeParams(base=0.1, per_sm=0.2, per_dram=0.0)
    obs = []
    for k, (a, o) in enumerate([(0.1, 0.2), (0.2, 0.3), (0.3, 0.1), (0.4, 0.4)]):
        base = Observation(a, 0.1, o, 0.1, 0.0, str(k))
        obs.append(Observation(a, 0.1, o, 0.1, float(predict(p, [base])[0]), str(k)))
    fit = fit_mode(obs)
    assert not fit.exponent_identified and fit.params.saturation_exponent == 1.0
    assert fit.params.per_sm == pytest.approx(0.2, abs=1e-6)


def test_too_few_mixes_fit_without_cross_validation() -> None:
    two_mixes = (["dlrm"] * 7, ["resnet18-cifar"] * 7)
    records = [r for r in synthetic_records()
               if r["kind"] in ("idle", "alone")
               or (r["sharing"] == "time-slicing" and r["workloads"] in two_mixes)]
    cal = calibrate(records, source="two-mixes.jsonl")
    stats = cal.stats["time-slicing"]
    assert stats["mixes"] == 2 and stats["cv"] is None and stats["all"]["n"] == 14
    assert any("no leave-one-mix-out error" in n for n in cal.notes)
    assert "| n/a |" in report_markdown(cal)
    tomllib.loads(interference_toml(cal))


def test_power_fit_edge_cases() -> None:
    with pytest.raises(ValueError):
        fit_power([0.5, 0.5], [100.0, 100.0])


def test_cli_calibrate(tmp_path: Path) -> None:
    results = tmp_path / "results.jsonl"
    results.write_text("".join(json.dumps(r) + "\n" for r in synthetic_records()))
    out = tmp_path / "fitted.toml"
    res = CliRunner().invoke(app, ["bench", "calibrate", str(tmp_path), "--out", str(out),
                                   "--profiles-out", str(tmp_path / "p.toml"),
                                   "--report", str(tmp_path / "cal.md")])
    assert res.exit_code == 0, res.output
    assert "Leave-one-mix-out" in res.output and "time-slicing" in res.output
    load_interference(out)
    assert (tmp_path / "cal.md").read_text().startswith("# Interference model calibration")


def test_cpu_rehearsal_results_are_refused() -> None:
    records = [{**r, "env": {"measured_on": "cpu"}} for r in synthetic_records()]
    with pytest.raises(InputError, match="CPU rehearsal"):
        calibrate(records, source="cpu.jsonl")
