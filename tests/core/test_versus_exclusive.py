"""Job by job against a plain queue: each job's completion time over its time under
``exclusive`` (``sim.metrics.versus_exclusive``), in the simulator's report."""

import json
import math

from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from collocate.cli import app
from collocate.sim.metrics import WORSE_TOLERANCE, versus_exclusive


def test_ratios_quantiles_and_the_jobs_worse_off():
    base = {"a": 10.0, "b": 20.0, "c": 40.0, "d": 5.0, "e": 7.0}
    mine = {"a": 5.0, "b": 20.0 * (1 + WORSE_TOLERANCE / 2), "c": 80.0, "d": None, "e": 7.0}
    summary, ratios = versus_exclusive(mine, base)
    assert ratios == {"a": 0.5, "b": 1.0 + WORSE_TOLERANCE / 2, "c": 2.0, "e": 1.0}
    assert summary.jobs == 4 and summary.max == 2.0 and summary.p50 == 1.012
    assert summary.worse == 2 and summary.not_done == 1  # c, and d that never ended done
    assert summary.tolerance == WORSE_TOLERANCE


def test_nothing_to_compare_gives_nan_not_an_error():
    summary, ratios = versus_exclusive({}, {"a": None})
    assert ratios == {} and summary.jobs == 0 and math.isnan(summary.p95) and summary.worse == 0


@given(st.dictionaries(st.text(min_size=1, max_size=3), st.floats(0.1, 1e5), min_size=1))
def test_exclusive_against_itself_is_one_everywhere(times):
    summary, ratios = versus_exclusive(dict(times), dict(times))
    assert set(ratios.values()) == {1.0} and summary.worse == 0 and summary.p50 == summary.max == 1.0


def test_simulate_reports_it_per_policy_against_exclusive(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("id,arrival_s,gpus,duration_s,peak_mib,sm_activity\n"
                     + "".join(f"{i},{i},1,600,9000,0.3\n" for i in range(6)) + "6,6,0,60,0,0\n")
    out = CliRunner().invoke(app, ["simulate", "--trace", str(trace), "--cluster", "2xA100-40GB",
                                   "--policy", "auto", "--format", "json", "--out", str(tmp_path / "o")])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output[out.output.index("{"):])
    v = doc["versus_exclusive"]["auto"]  # exclusive was run as the baseline though not compared
    assert v["jobs"] == 7 and v["not_done"] == 0 and v["p50"] < 1.0
    rows = (tmp_path / "o" / "versus_exclusive.csv").read_text().splitlines()
    assert rows[0] == "policy,id,ratio" and len(rows) == 8 and "auto,6,1.0" in rows
