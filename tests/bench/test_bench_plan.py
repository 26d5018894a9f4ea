"""The benchmark plan: enumeration, order, validation, memory fit, printing."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from collocate.bench.plan import (
    DEFAULT_MIXES,
    Scenario,
    build_plan,
    format_plan,
    parse_mix,
)
from collocate.bench.runner import fits
from collocate.bench.workloads import DEFAULT_WORKLOADS, WORKLOADS
from collocate.cli import app
from collocate.common.errors import InputError, UnknownNameError


def test_default_plan_enumerates_alone_copies_and_mixes_in_order() -> None:
    plan = build_plan()
    n_w, n_m = len(DEFAULT_WORKLOADS), len(DEFAULT_MIXES)
    assert len(plan) == n_w + 2 * (3 * n_w + n_m)
    assert [s.sharing for s in plan[:n_w]] == ["alone"] * n_w
    assert plan[n_w] == Scenario(("resnet18-cifar",) * 2, "time-slicing")
    assert plan[n_w].id == "time-slicing:2x resnet18-cifar"
    assert Scenario(("resnet152", "dlrm"), "mps") in plan
    sizes = [len(s.jobs) for s in plan]
    first_three = min(i for i, s in enumerate(plan) if s.kind == "copies" and len(s.jobs) == 3)
    assert first_three > max(i for i, s in enumerate(plan) if s.kind == "mix")
    assert sizes[-1] == 7 and plan[-1].sharing == "mps"
    assert len({s.id for s in plan}) == len(plan)
    assert {s.kind for s in plan} == {"alone", "copies", "mix"}


def test_narrowing_drops_mixes_with_other_workloads() -> None:
    plan = build_plan(["resnet152", "dlrm"], copies=[1, 2], sharing=["mps"])
    assert [s.id for s in plan] == ["alone:resnet152", "alone:dlrm", "mps:2x resnet152",
                                    "mps:2x dlrm", "mps:resnet152+dlrm"]
    assert build_plan(["dlrm"], copies=[3], sharing=["time-slicing"]) == [
        Scenario(("dlrm",) * 3, "time-slicing")]


def test_bad_input_names_the_valid_choices() -> None:
    with pytest.raises(UnknownNameError, match="resnet18-cifar"):
        build_plan(["resnet9000"])
    with pytest.raises(InputError, match="time-slicing"):
        build_plan(sharing=["mig"])
    with pytest.raises(InputError):
        build_plan(copies=[0])
    with pytest.raises(InputError, match="two workloads"):
        parse_mix("resnet152")
    assert parse_mix("resnet152 + dlrm") == ("resnet152", "dlrm")


def test_workloads_cover_the_issue_list() -> None:
    sizes = {WORKLOADS[w].size for w in DEFAULT_WORKLOADS}
    assert sizes == {"small", "medium", "large"}
    assert {"resnet50-64", "resnet50-224", "resnet152", "transformer-encoder", "dlrm"} <= set(WORKLOADS)


def test_memory_fit_check() -> None:
    seven = Scenario(("resnet152",) * 7, "mps")
    assert fits(seven, {}, 80_000) is None  # unknown: run it
    assert fits(seven, {"resnet152": 9_000}, 80_000) is None
    assert "needs about 84000 MiB" in fits(seven, {"resnet152": 12_000}, 80_000)


def test_list_and_dry_run_print_the_plan() -> None:
    res = CliRunner().invoke(app, ["bench", "run", "--list"])
    assert res.exit_code == 0 and "56 scenarios" in res.output
    res = CliRunner().invoke(app, ["bench", "run", "--device", "cpu", "--dry-run", "--copies", "1",
                                   "--workloads", "dlrm"])
    assert res.exit_code == 0, res.output
    assert "collocate.bench.worker --workload dlrm" in res.output
    assert "NOT GPU measurements" in res.output
    assert "1 scenarios" in format_plan(build_plan(["dlrm"], copies=[1]), warmup_s=1, seconds=1)
