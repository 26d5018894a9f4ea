"""``collocate bench calibrate``: fit the interference and power model to bench measurements.

Inputs are the records of ``collocate bench run`` (``results.jsonl``): the solo runs give each
workload's SM and DRAM activity (GPM, over the measurement window) and its solo samples/s; every
collocated job gives one observation ``slowdown = solo samples/s / collocated samples/s``. Each
sharing mode is fitted on its own (``fit.fit_mode``). The held-out error is leave-one-mix-out
cross-validation (``fit.cross_validate``): every mix is predicted by the model fitted on all the
other mixes, and the report gives the relative and absolute errors of these out-of-fold per-job
predictions. The parameters written are fitted on all mixes (cross-validation estimates the
error, all the data set the parameters).

Power: board power over each scenario's window against ``busy`` = the GPU's *measured* SM
activity over that window (GPM, clipped to [0, 1]); the idle reading has busy 0. The activity
a mix realizes is not ``min(1, sum of solo activities)``: on the H100 bench data it matches
``min(1, sum_i a_i / s_i)`` (solo activity over slowdown) to 0.035 on average over the shared
scenarios, while the sum of solo activities misses by 0.155 on average and up to 0.51 (time-slicing 7 x dlrm reads 0.49,
not 1). The simulator feeds the power model that realized activity, so the fit uses the
measured one.

The output TOML has the format of ``collocate/data/interference.toml`` and loads with
``collocate.core.interference.load_interference``; what it does not measure (modes without
measurements; MIG instances, which the bench never changes) keeps the packaged parameters and
says so in its provenance.
"""

from __future__ import annotations

import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from collocate.bench.fit import (
    ModeFit,
    Observation,
    PowerFit,
    cross_validate,
    errors,
    fit_mode,
    fit_power,
    predict,
)
from collocate.bench.plan import ALONE, SHARING_MODES
from collocate.bench.report import env_of, solo_rates
from collocate.bench.workloads import WORKLOADS
from collocate.common.errors import InputError


@dataclass(frozen=True, slots=True)
class Profile:
    sm: float
    dram: float


@dataclass
class Calibration:
    """Everything ``calibrate`` found: fits, errors, profiles, and what could not be fitted."""

    env: dict[str, Any]
    source: str
    profiles: dict[str, Profile]
    fits: dict[str, ModeFit] = field(default_factory=dict)
    stats: dict[str, dict[str, Any]] = field(default_factory=dict)
    power: dict[str, PowerFit] = field(default_factory=dict)
    idle_reading_watts: float | None = None  # the idle record's measured power
    notes: list[str] = field(default_factory=list)


def solo_profiles(records: Sequence[dict[str, Any]]) -> dict[str, Profile]:
    """SM and DRAM activity of each workload alone (GPM over its measurement window)."""
    out: dict[str, Profile] = {}
    for r in records:
        if r.get("sharing") != ALONE or r.get("status") != "ok" or not r.get("workloads"):
            continue
        gpu = r.get("gpu", {})
        if gpu.get("sm_activity") is None or gpu.get("dram_activity") is None:
            continue
        out[r["workloads"][0]] = Profile(float(gpu["sm_activity"]), float(gpu["dram_activity"]))
    return out


def observations(records: Sequence[dict[str, Any]], profiles: dict[str, Profile],
                 mode: str) -> list[Observation]:
    """One observation per successful job of every collocated scenario under ``mode``."""
    solo = solo_rates(records)
    obs = []
    for r in records:
        if r.get("sharing") != mode or r.get("status") != "ok" or len(r.get("jobs", [])) < 2:
            continue
        names = [j["workload"] for j in r["jobs"]]
        if any(n not in profiles or n not in solo for n in names):
            continue
        group = "+".join(sorted(names))
        for i, job in enumerate(r["jobs"]):
            rate = job.get("samples_per_s")
            if not rate:
                continue
            others = [profiles[n] for k, n in enumerate(names) if k != i]
            me = profiles[names[i]]
            obs.append(Observation(me.sm, me.dram, sum(p.sm for p in others),
                                   sum(p.dram for p in others), solo[names[i]] / rate, group))
    return obs


def _gpu_type(env: dict[str, Any]) -> str:
    from collocate.gpus.nvml import type_name_from_product

    return type_name_from_product(str(env.get("device_name") or "unknown"))


def power_points(records: Sequence[dict[str, Any]]) -> tuple[list[float], list[float]]:
    """(busy, watts) per scenario with a power reading: busy is the measured SM activity, clipped
    to [0, 1], and 0 for the idle reading; scenarios without an SM activity reading are left out."""
    busy, watts = [], []
    for r in records:
        gpu = r.get("gpu", {})
        if r.get("status") != "ok" or gpu.get("power_watts") is None:
            continue
        if r.get("kind") == "idle":
            busy.append(0.0)
        elif gpu.get("sm_activity") is not None:
            busy.append(min(1.0, max(0.0, float(gpu["sm_activity"]))))
        else:
            continue
        watts.append(float(gpu["power_watts"]))
    return busy, watts


def _idle_reading(records: Sequence[dict[str, Any]]) -> float | None:
    for r in records:
        if r.get("kind") == "idle" and r.get("status") == "ok":
            power = r.get("gpu", {}).get("power_watts")
            if power is not None:
                return float(power)
    return None


def _fit_one_mode(cal: Calibration, mode: str, obs: list[Observation]) -> None:
    measured = [o.slowdown for o in obs]
    stats: dict[str, Any] = {"observations": len(obs), "mixes": len({o.group for o in obs})}
    try:
        held_out = cross_validate(obs)
        stats["cv"] = errors(held_out, measured)
        stats["cv_log_ratios"] = [float(v) for v in np.log(np.asarray(measured) / held_out)]
    except ValueError as exc:
        stats["cv"] = None
        cal.notes.append(f"{mode}: no leave-one-mix-out error ({exc})")
    full = fit_mode(obs)
    stats["all"] = errors(predict(full.params, obs), measured)
    if not full.exponent_identified:
        cal.notes.append(f"{mode}: no over-subscribed scenario (sum of activities <= 1), so "
                         "saturation_exponent keeps its prior 1.0")
    cal.fits[mode], cal.stats[mode] = full, stats


def calibrate(records: Sequence[dict[str, Any]], *, source: str) -> Calibration:
    """Fit every sharing mode that has data, and the power model; see the module docstring."""
    if env_of(records).get("measured_on") == "cpu":
        raise InputError(
            f"{source}: these are CPU rehearsal numbers (tiny models, emulated GPU readings)",
            hint="calibrate only results of `collocate bench run --device cuda` on a real GPU",
        )
    profiles = solo_profiles(records)
    if not profiles:
        raise InputError(
            f"{source}: no solo run with SM and DRAM activity",
            hint="the alone scenarios must have run on a GPU whose NVML has GPM (Hopper or "
            "newer); see `python benchmarks/gpu/nvml_probe.py` for what works",
        )
    cal = Calibration(env_of(records), source, profiles, idle_reading_watts=_idle_reading(records))
    for mode in SHARING_MODES:
        obs = observations(records, profiles, mode)
        if len(obs) < 3:
            cal.notes.append(f"{mode}: {len(obs)} observation(s), not enough to fit; "
                             "the packaged parameters are kept")
            continue
        _fit_one_mode(cal, mode, obs)
    busy, watts = power_points(records)
    try:
        cal.power[_gpu_type(cal.env)] = fit_power(busy, watts)
    except ValueError as exc:
        cal.notes.append(f"power: not fitted ({exc}); the packaged exponent is kept")
    return cal


# -- output ---------------------------------------------------------------------------------

def _packaged() -> dict[str, Any]:
    text = resources.files("collocate").joinpath("data/interference.toml").read_text()
    return tomllib.loads(text)


def _num(v: float) -> str:
    return f"{v:.4g}" if abs(v) >= 1e-4 or v == 0 else f"{v:.3e}"


def _str(v: Any) -> str:
    return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'


_ERROR_KEYS = ("median_rel_error", "p90_rel_error", "max_rel_error", "median_abs_error",
               "max_abs_error", "mean_abs_error")


def _err(stats: dict[str, Any], part: str, key: str) -> str:
    """An error for text: relative ones as percentages, absolute ones in slowdown units."""
    v = (stats.get(part) or {}).get(key)
    if v is None:
        return "n/a"
    return f"{100 * v:.1f}%" if key.endswith("_rel_error") else f"{v:.3f}"


def _error_summary(stats: dict[str, Any], part: str) -> str:
    return (f"relative error median/p90/max {_err(stats, part, 'median_rel_error')}/"
            f"{_err(stats, part, 'p90_rel_error')}/{_err(stats, part, 'max_rel_error')}, "
            f"absolute median/max {_err(stats, part, 'median_abs_error')}/"
            f"{_err(stats, part, 'max_abs_error')}")


def _log_ratios(values: Sequence[float]) -> str:
    """The held-out ``log(measured / predicted)`` of every job, in the order observed: what the
    simulator's ``--model-error`` draws from (``collocate.sim.model_error``)."""
    return "[" + ", ".join(f"{v:.4f}" for v in values) + "]"


def interference_toml(cal: Calibration) -> str:
    """The fitted model as TOML in the packaged file's format (loads with load_interference)."""
    env, packaged = cal.env, _packaged()
    where = (f"{env.get('device_name')}, driver {env.get('driver')}, CUDA {env.get('cuda')}, "
             f"torch {env.get('torch')}, {env.get('date_utc')}")
    lines = [
        "# Interference and power model fitted by `collocate bench calibrate` (docs/bench.md).",
        "# Formulas: see collocate/data/interference.toml (same format, loads with",
        "# collocate.core.interference.load_interference).",
        f"# Measured on {where}; source {cal.source}.",
        *[f"# note: {n}" for n in cal.notes],
        "",
        "[calibration]",
        f"device = {_str(env.get('device_name'))}",
        f"driver = {_str(env.get('driver'))}",
        f"cuda = {_str(env.get('cuda'))}",
        f"torch = {_str(env.get('torch'))}",
        f"date = {_str(env.get('date_utc'))}",
        f"measured_on = {_str(env.get('measured_on'))}",
        f"source = {_str(cal.source)}",
        'method = "per-mode least squares on per-job slowdown (variable projection over '
        'saturation_exponent), fitted on all mixes; cv_* errors: leave-one-mix-out '
        'cross-validation (each mix predicted by the fit on all other mixes); all_* errors: '
        'in-sample; relative error = |predicted / measured - 1|"',
    ]
    for mode, stats in cal.stats.items():
        lines += ["", f"[calibration.modes.{mode}]",
                  f"observations = {stats['observations']}", f"mixes = {stats['mixes']}"]
        for part in ("cv", "all"):
            for key in _ERROR_KEYS:
                v = (stats.get(part) or {}).get(key)
                if v is not None:
                    lines.append(f"{part}_{key} = {_num(v)}")
        if stats.get("cv_log_ratios"):
            lines.append(f"cv_log_ratios = {_log_ratios(stats['cv_log_ratios'])}")
    for mode in SHARING_MODES:
        lines += ["", f"[modes.{mode}]"]
        fit = cal.fits.get(mode)
        if fit is None:
            old = packaged["modes"][mode]
            lines += [f"{k} = {_num(float(v))}" for k, v in old.items() if k != "provenance"]
            lines.append("provenance = " + _str(f"not measured in {cal.source}; kept from the "
                                                f"packaged model: {old.get('provenance', '')}"))
            continue
        p, stats = fit.params, cal.stats[mode]
        lines += [f"base = {_num(p.base)}", f"per_sm = {_num(p.per_sm)}",
                  f"per_dram = {_num(p.per_dram)}",
                  f"saturation_exponent = {_num(p.saturation_exponent)}"]
        exp_note = "" if fit.exponent_identified else "; saturation_exponent not identifiable, prior"
        lines.append("provenance = " + _str(
            f"fitted by collocate bench calibrate to {stats['observations']} jobs in "
            f"{stats['mixes']} mixes of {cal.source} ({where}); leave-one-mix-out "
            f"{_error_summary(stats, 'cv')}{exp_note}"))
    mig = packaged["mig"]
    lines += ["", "[mig]",
              *[f"{k} = {_num(float(v))}" for k, v in mig.items() if k != "provenance"],
              "provenance = " + _str("not measured (the bench never changes MIG settings); kept "
                                     f"from the packaged model: {mig.get('provenance', '')}")]
    lines += ["", "[power]"]
    if cal.power:
        (type_name, pw), *_ = cal.power.items()
        lines += [f"exponent = {_num(pw.exponent)}",
                  "provenance = " + _str(f"fitted to {pw.n} power readings on {type_name} "
                                         f"({where}) against measured SM activity; "
                                         f"rmse {pw.rmse:.1f} W")]
        for type_name, pw in cal.power.items():
            lines += ["", f'[power.gpus."{type_name}"]', f"idle_watts = {_num(pw.idle_watts)}",
                      f"max_watts = {_num(pw.max_watts)}", f"exponent = {_num(pw.exponent)}",
                      f"observations = {pw.n}", f"rmse_watts = {_num(pw.rmse)}",
                      f"exponent_identified = {str(pw.exponent_identified).lower()}"]
            if cal.idle_reading_watts is not None:
                lines.append(f"idle_watts_measured = {_num(cal.idle_reading_watts)}")
    else:
        old = packaged.get("power", {})
        lines += [f"exponent = {_num(float(old.get('exponent', 1.0)))}",
                  "provenance = " + _str(f"not measured; kept: {old.get('provenance', '')}")]
    return "\n".join(lines) + "\n"


def profiles_toml(cal: Calibration) -> str:
    """Measured solo activity per workload, in the style of data/workload_profiles.toml."""
    env = cal.env
    lines = ["# Solo GPU activity measured by `collocate bench run` (GPM SM_UTIL and DRAM_BW_UTIL",
             "# over each workload's measurement window, alone on the GPU).",
             f"# {env.get('device_name')}, driver {env.get('driver')}, CUDA {env.get('cuda')}, "
             f"torch {env.get('torch')}, {env.get('date_utc')}; source {cal.source}.",
             "# Keys are bench workload names; `family` is the model key of "
             "data/workload_profiles.toml.", "", "[models]"]
    for name, p in sorted(cal.profiles.items()):
        family = WORKLOADS[name].family if name in WORKLOADS else name
        lines.append(f'"{name}" = {{ sm = {p.sm:.4f}, dram = {p.dram:.4f}, '
                     f'family = "{family}" }}')
    return "\n".join(lines) + "\n"


def report_markdown(cal: Calibration) -> str:
    env = cal.env
    out = ["# Interference model calibration", "",
           f"- device: {env.get('device_name')} (measured on {env.get('measured_on')}), driver "
           f"{env.get('driver')}, CUDA {env.get('cuda')}, torch {env.get('torch')}, "
           f"{env.get('date_utc')}", f"- source: `{cal.source}`", "",
           "Errors of per-job slowdown. Leave-one-mix-out (LOMO): each mix in turn is predicted "
           "by the model fitted on all the other mixes; the errors are over all these "
           "out-of-fold predictions. Relative error is |predicted / measured − 1|; absolute "
           "error is in slowdown units (largest for the 7-copy scenarios). In-sample: the "
           "parameters shown (fitted on all mixes) on the same data.", "",
           "| mode | base | per_sm | per_dram | sat. exp. | jobs | mixes "
           "| LOMO rel. err. median | p90 | max | LOMO abs. err. median | max "
           "| in-sample rel. median | max |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for mode, fit in cal.fits.items():
        p, s = fit.params, cal.stats[mode]
        cells = [mode, f"{p.base:.3f}", f"{p.per_sm:.3f}", f"{p.per_dram:.3f}",
                 f"{p.saturation_exponent:.2f}", str(s["observations"]), str(s["mixes"]),
                 *(_err(s, "cv", k) for k in ("median_rel_error", "p90_rel_error",
                                              "max_rel_error", "median_abs_error",
                                              "max_abs_error")),
                 _err(s, "all", "median_rel_error"), _err(s, "all", "max_rel_error")]
        out.append("| " + " | ".join(cells) + " |")
    idle = ("" if cal.idle_reading_watts is None
            else f" (measured idle reading {cal.idle_reading_watts:.0f} W)")
    for type_name, pw in cal.power.items():
        out += ["", f"Power ({type_name}), against the measured SM activity: idle "
                    f"{pw.idle_watts:.0f} W{idle}, max {pw.max_watts:.0f} W, exponent "
                    f"{pw.exponent:.2f} ({pw.n} readings, rmse {pw.rmse:.1f} W)"]
    out += ["", "Solo profiles:", "", "| workload | SM activity | DRAM activity |", "|---|---:|---:|"]
    out += [f"| {n} | {p.sm:.3f} | {p.dram:.3f} |" for n, p in sorted(cal.profiles.items())]
    if cal.notes:
        out += ["", "Notes:", *[f"- {n}" for n in cal.notes]]
    return "\n".join(out) + "\n"


def write_outputs(cal: Calibration, out: Path, profiles_out: Path | None,
                  report_out: Path | None) -> list[Path]:
    from collocate.core.interference import load_interference

    out.write_text(interference_toml(cal))
    load_interference(out)  # what we wrote must load
    written = [out]
    if profiles_out is not None:
        profiles_out.write_text(profiles_toml(cal))
        written.append(profiles_out)
    if report_out is not None:
        report_out.write_text(report_markdown(cal))
        written.append(report_out)
    return written
