"""`collocate simulate` in an 80-column terminal: every table and line fits, nothing is cut, and
its JSON stays strict JSON (issue 37: the tables were ~114 columns wide)."""

import json
import os
import subprocess
import sys

import pytest

POLICIES = ["exclusive", "declared-memory", "carma-magm"]  # declared-memory: the longest name


def _simulate(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "80"}
    for name in ("FORCE_COLOR", "NO_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"):
        env.pop(name, None)
    out = subprocess.run([sys.executable, "-m", "collocate.cli", "simulate", "--synthetic", "6",
                          "--cluster", "2xA100-40GB", "--policy", ",".join(POLICIES), *args],
                         capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    return out


def _no_nan(token: str) -> None:
    raise AssertionError(f"{token} is not JSON")


def test_the_comparison_fits_80_columns_with_every_figure_whole():
    pytest.importorskip("scipy")  # --floor's LP
    text = _simulate("--floor").stdout
    doc = json.loads(_simulate("--floor", "--format", "json").stdout, parse_constant=_no_nan)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80, text
    assert "…" not in text
    for summary in doc["policies"]:
        rows = [line.split() for line in lines if line.split()[:1] == [summary["policy"]]]
        # the times row, the use row, and (all but exclusive) the job-by-job row
        assert len(rows) == (2 if summary["policy"] == "exclusive" else 3), text
        times, use = rows[0], rows[1]
        assert float(times[1]) == pytest.approx(summary["makespan_min"], abs=0.051)
        assert float(times[2]) == pytest.approx(summary["mean_jct_min"], abs=0.051)
        assert [int(n) for n in use[4:]] == [summary[k] for k in ("oom_crashes", "recovered_jobs",
                                                                   "failed", "rejected")]
    for name, gap in doc["floor"]["gap_closed"].items():
        share = "n/a" if gap["model"] is None else f"{gap['model']:.0%}"
        assert f"  {name}: model floor {share}, SM floor" in text
