"""Policy parameters are checked by type and range when a policy is made, so `serve` and
`simulate` refuse a bad one at start (exit 2, naming it) instead of failing every round."""

import subprocess
import sys

import pytest

from collocate.common.errors import InputError
from collocate.core.policies import make_policy, parse_params, policy_parameters


def cli(*args, tmp_path):
    return subprocess.run([sys.executable, "-m", "collocate.cli", *args], capture_output=True, text=True,
                          timeout=60, check=False, cwd=tmp_path)


def test_serve_refuses_a_parameter_of_the_wrong_type_at_start(tmp_path):
    out = cli("serve", "--state-dir", str(tmp_path / "state"), "--gpus", "emulated:1xA100-40GB",
              "--policy", "auto", "--param", "min_gain=abc", tmp_path=tmp_path)
    assert out.returncode == 2, out.stdout + out.stderr
    text = out.stdout + out.stderr
    assert "min_gain must be a number 0 or more, got 'abc'" in text
    assert "max_slowdown" in text  # the valid names are listed
    assert not (tmp_path / "state" / "daemon.pid").exists()  # nothing started


def test_simulate_refuses_an_out_of_range_parameter(tmp_path):
    out = cli("simulate", "--synthetic", "5", "--cluster", "1xA100-40GB", "--policy", "auto",
              "--param", "pack_tolerance=1.5", tmp_path=tmp_path)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "pack_tolerance must be a number between 0 and 1, got 1.5" in out.stdout + out.stderr


@pytest.mark.parametrize("text, message", [
    ("reserve_after_s=-1", "reserve_after_s must be a number 0 or more"),
    ("startup_slots=-1", "startup_slots must be an integer 0 or more"),
    ("startup_max_slowdown=0.9", "startup_max_slowdown must be a number 1 or more"),
    ("backfill_depth=2.5", "backfill_depth must be an integer 1 or more"),
    ("backfill_depth=0", "backfill_depth must be an integer 1 or more"),
    ("max_slowdown=0.5", "max_slowdown must be a number 1 or more"),
    ("limits.sm=1.2", "limits.sm must be a number between 0 and 1"),
    ("min_gain=nan", "min_gain must be a number 0 or more"),
])
def test_bad_values_name_the_parameter_and_the_range(text, message):
    with pytest.raises(InputError, match=message):
        make_policy("auto", **parse_params([text]))


def test_good_values_are_converted_to_the_field_type_and_groups_are_set_by_member():
    policy = make_policy("carma-magm", **parse_params(["settle_s=5", "limits.sm=0.9"]))
    assert policy.settle_s == 5.0 and isinstance(policy.settle_s, float)
    assert policy.limits.sm == 0.9 and policy.limits.dram == 0.40  # the rest of the group kept
    assert make_policy("auto", backfill_depth="8").backfill_depth == 8
    assert make_policy("auto", startup_slots="0").startup_slots == 0  # 0 turns the rule off
    assert "limits.occupancy" in policy_parameters("auto") and "interference" not in policy_parameters("auto")
