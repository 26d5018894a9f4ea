"""The packaged power exponent is what the measured mini-trace energies give (refit here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from collocate.bench.energy_fit import fit_exponent
from collocate.core.interference import default_interference

RUNS = Path(__file__).resolve().parents[2] / "benchmarks/results/minitrace-h100-80gb-hbm3-2026-11-22"


def test_packaged_power_exponent_is_the_energy_fit_of_the_h100_minitrace():
    fit = fit_exponent(RUNS)
    assert fit["exponent"] == pytest.approx(default_interference().power_exponent)
    assert len(fit["runs"]) == 3  # exclusive and carma-magm (auto's runs used a guard it no longer has)
    for run in fit["runs"]:  # every run's simulated energy within 3% of the measured one
        assert run["simulated_kwh"] == pytest.approx(run["energy_kwh"], rel=0.03)


def test_collocation_saves_energy_in_the_simulator_as_measured():
    runs = {(r["policy"], r["sharing"]): r for r in fit_exponent(RUNS)["runs"]}
    exclusive = runs["exclusive", "time-slicing"]
    for key, run in runs.items():
        if key[0] != "exclusive":
            assert run["simulated_kwh"] < 0.92 * exclusive["simulated_kwh"]
            assert run["energy_kwh"] < 0.92 * exclusive["energy_kwh"]
