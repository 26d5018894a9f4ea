"""``collocate bench calibrate``: fit the interference and power model to bench measurements.

Inputs are the records of ``collocate bench run`` (``results.jsonl``): the solo runs give each
workload's SM and DRAM activity (GPM, over the measurement window) and its solo samples/s; every
collocated job gives one observation ``slowdown = solo samples/s / collocated samples/s``. Each
sharing mode is fitted on its own (``fit.fit_mode``). Mixes are split into a training and a
held-out set; the report gives the held-out error of per-job slowdown, and the parameters written
are then refitted on all mixes (the usual practice: the split estimates the error, all the data
sets the parameters).

Power: board power over each scenario's window against ``busy = min(1, sum of the solo SM
activities of its jobs)`` — the same quantity the simulator and the emulated GPUs feed into the
power model — plus the idle reading, per GPU type.

The output TOML has the format of ``collocate/data/interference.toml`` and loads with
``collocate.interference.load_interference``; modes without measurements (MIG is never changed by
the bench) keep the packaged parameters and say so in their provenance.
"""

from __future__ import annotations

import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from collocate.bench.fit import (
    ModeFit,
    Observation,
    PowerFit,
    errors,
    fit_mode,
    fit_power,
    split_groups,
)
from collocate.bench.plan import ALONE, SHARING_MODES
from collocate.bench.report import env_of, solo_rates
from collocate.bench.workloads import WORKLOADS
from collocate.errors import InputError
from collocate.interference import ModeParams


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


def calibrate(records: Sequence[dict[str, Any]], *, source: str, holdout: float = 0.3,
              seed: int = 0) -> Calibration:
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
    cal = Calibration(env_of(records), source, profiles)
    for mode in SHARING_MODES:
        obs = observations(records, profiles, mode)
        if len(obs) < 3:
            cal.notes.append(f"{mode}: {len(obs)} observation(s), not enough to fit; "
                             "the packaged parameters are kept")
            continue
        groups = [o.group for o in obs]
        train_groups, held = split_groups(groups, holdout=holdout, seed=seed)
        train = [o for o in obs if o.group in train_groups]
        test = [o for o in obs if o.group in held]
        stats: dict[str, Any] = {"observations": len(obs), "mixes": len(set(groups)),
                                 "holdout_mixes": sorted(held)}
        if held and len(train) >= 3:
            split_fit = fit_mode(train)
            stats["train"] = errors(split_fit.params, train)
            stats["holdout"] = errors(split_fit.params, test)
        else:
            stats["holdout"] = errors(ModeParams(0.0), [])
            cal.notes.append(f"{mode}: fewer than 3 mixes, so no held-out error")
        full = fit_mode(obs)
        stats["all"] = errors(full.params, obs)
        if not full.exponent_identified:
            cal.notes.append(f"{mode}: no over-subscribed scenario (sum of activities <= 1), so "
                             "saturation_exponent keeps its prior 1.0")
        cal.fits[mode], cal.stats[mode] = full, stats
    busy, watts = [], []
    for r in records:
        power = r.get("gpu", {}).get("power_watts")
        if r.get("status") != "ok" or power is None:
            continue
        if r.get("kind") == "idle":
            busy.append(0.0)
        elif all(w in profiles for w in r["workloads"]):
            busy.append(min(1.0, sum(profiles[w].sm for w in r["workloads"])))
        else:
            continue
        watts.append(float(power))
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


def _err(stats: dict[str, Any], part: str, key: str) -> str:
    v = stats.get(part, {}).get(key)
    return "n/a" if v is None else f"{v:.3f}"


def interference_toml(cal: Calibration) -> str:
    """The fitted model as TOML in the packaged file's format (loads with load_interference)."""
    env, packaged = cal.env, _packaged()
    where = (f"{env.get('device_name')}, driver {env.get('driver')}, CUDA {env.get('cuda')}, "
             f"torch {env.get('torch')}, {env.get('date_utc')}")
    lines = [
        "# Interference and power model fitted by `collocate bench calibrate` (docs/bench.md).",
        "# Formulas: see collocate/data/interference.toml (same format, loads with",
        "# collocate.interference.load_interference).",
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
        'saturation_exponent); mixes split train/held-out, parameters refitted on all"',
    ]
    for mode, stats in cal.stats.items():
        lines += ["", f"[calibration.modes.{mode}]",
                  f"observations = {stats['observations']}", f"mixes = {stats['mixes']}",
                  "holdout_mixes = [" + ", ".join(_str(m) for m in stats["holdout_mixes"]) + "]"]
        for part in ("train", "holdout", "all"):
            for key in ("median_abs_error", "max_abs_error"):
                v = stats.get(part, {}).get(key)
                if v is not None:
                    lines.append(f"{part}_{key} = {_num(v)}")
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
            f"{stats['mixes']} mixes of {cal.source} ({where}); held-out median/max abs error "
            f"{_err(stats, 'holdout', 'median_abs_error')}/"
            f"{_err(stats, 'holdout', 'max_abs_error')}{exp_note}"))
    mig = packaged["modes"]["mig"]
    lines += ["", "[modes.mig]",
              *[f"{k} = {_num(float(v))}" for k, v in mig.items() if k != "provenance"],
              "provenance = " + _str("not measured (the bench never changes MIG settings); kept "
                                     f"from the packaged model: {mig.get('provenance', '')}")]
    lines += ["", "[power]"]
    if cal.power:
        (type_name, pw), *_ = cal.power.items()
        lines += [f"exponent = {_num(pw.exponent)}",
                  "provenance = " + _str(f"fitted to {pw.n} power readings on {type_name} "
                                         f"({where}); rmse {pw.rmse:.1f} W")]
        for type_name, pw in cal.power.items():
            lines += ["", f'[power.gpus."{type_name}"]', f"idle_watts = {_num(pw.idle_watts)}",
                      f"max_watts = {_num(pw.max_watts)}", f"exponent = {_num(pw.exponent)}",
                      f"observations = {pw.n}", f"rmse_watts = {_num(pw.rmse)}",
                      f"exponent_identified = {str(pw.exponent_identified).lower()}"]
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
           "| mode | base | per_sm | per_dram | sat. exp. | jobs | mixes | held-out mixes "
           "| held-out median abs err | max | all-data median | max |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for mode, fit in cal.fits.items():
        p, s = fit.params, cal.stats[mode]
        out.append(f"| {mode} | {p.base:.3f} | {p.per_sm:.3f} | {p.per_dram:.3f} | "
                   f"{p.saturation_exponent:.2f} | {s['observations']} | {s['mixes']} | "
                   f"{len(s['holdout_mixes'])} | {_err(s, 'holdout', 'median_abs_error')} | "
                   f"{_err(s, 'holdout', 'max_abs_error')} | {_err(s, 'all', 'median_abs_error')}"
                   f" | {_err(s, 'all', 'max_abs_error')} |")
    for type_name, pw in cal.power.items():
        out += ["", f"Power ({type_name}): idle {pw.idle_watts:.0f} W, max {pw.max_watts:.0f} W, "
                    f"exponent {pw.exponent:.2f} ({pw.n} readings, rmse {pw.rmse:.1f} W)"]
    out += ["", "Solo profiles:", "", "| workload | SM activity | DRAM activity |", "|---|---:|---:|"]
    out += [f"| {n} | {p.sm:.3f} | {p.dram:.3f} |" for n, p in sorted(cal.profiles.items())]
    if cal.notes:
        out += ["", "Notes:", *[f"- {n}" for n in cal.notes]]
    return "\n".join(out) + "\n"


def write_outputs(cal: Calibration, out: Path, profiles_out: Path | None,
                  report_out: Path | None) -> list[Path]:
    from collocate.interference import load_interference

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
