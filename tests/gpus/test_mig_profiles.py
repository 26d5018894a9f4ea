from __future__ import annotations

import pytest

from collocate.common.errors import InputError, UnknownNameError
from collocate.gpus.mig_profiles import (
    MIG_PROFILES,
    mig_profile,
    place,
    profile_from_device_name,
    profile_from_slices,
)


def test_tables_follow_the_slice_rules() -> None:
    for type_name, table in MIG_PROFILES.items():
        for p in table.values():
            assert p.name.startswith(f"{p.compute_slices}g."), (type_name, p.name)
            if p.memory_mib is not None:
                whole = table[next(n for n in table if n.startswith("7g."))].memory_mib
                if whole is not None:
                    assert p.memory_mib <= whole * p.memory_slices / 8 + 1, (type_name, p.name)


def test_h100_sm_counts_are_not_proportional() -> None:
    assert mig_profile("H100-80GB", "1g.20gb").sm_count == 26
    assert mig_profile("H100-80GB", "7g.80gb").sm_count == 132
    assert mig_profile("A100-40GB", "3g.20gb").memory_mib == pytest.approx(19.5 * 1024)


@pytest.mark.parametrize(
    "names",
    [["4g.20gb", "3g.20gb"], ["3g.20gb", "4g.20gb"], ["1g.5gb"] * 7, ["3g.20gb", "2g.10gb", "1g.5gb", "1g.5gb"],
     ["7g.40gb"], ["1g.10gb"] * 4, ["4g.20gb", "2g.10gb", "1g.10gb"]],
)
def test_valid_layouts_are_placed(names: list[str]) -> None:
    starts = place("A100-40GB", names)
    assert len(starts) == len(names)


@pytest.mark.parametrize(
    ("names", "why"),
    [
        (["4g.20gb", "4g.20gb"], "compute slices"),
        (["7g.40gb", "1g.5gb"], "compute slices"),
        (["3g.20gb"] * 3, "compute slices"),
        (["1g.10gb"] * 5, "at most 4"),
        (["3g.20gb", "3g.20gb", "1g.10gb"], "cannot be placed"),
    ],
)
def test_invalid_layouts_say_why(names: list[str], why: str) -> None:
    with pytest.raises(InputError, match=why):
        place("A100-40GB", names)


def test_unknown_profile_lists_valid_ones() -> None:
    with pytest.raises(UnknownNameError) as err:
        mig_profile("A100-40GB", "3g.40gb")
    assert "3g.20gb" in str(err.value)


def test_profile_names_from_nvml() -> None:
    assert profile_from_device_name("NVIDIA A100-SXM4-40GB MIG 3g.20gb") == "3g.20gb"
    assert profile_from_device_name("NVIDIA H100 80GB HBM3 MIG 1c.3g.40gb") == "3g.40gb"
    assert profile_from_device_name("NVIDIA A100-SXM4-40GB MIG 1g.5gb+me") == "1g.5gb+me"
    assert profile_from_device_name("NVIDIA A100-SXM4-40GB") is None
    assert profile_from_slices("H100-80GB", 1, 20000) == "1g.20gb"
    assert profile_from_slices("H100-80GB", 1, 9900) == "1g.10gb"
    assert profile_from_slices("L4-24GB", 1, 9900) is None


def test_an_instances_sm_fraction_is_taken_once_for_every_backend() -> None:
    from collocate.gpus.mig_profiles import sm_fraction

    assert sm_fraction("A100-40GB", 42, "3g.20gb") == pytest.approx(3 / 7)  # SMs over the 7g's
    assert sm_fraction("H100-80GB", 60, "3g.40gb") == pytest.approx(60 / 132)  # not 3/7
    assert sm_fraction("H200-141GB", None, "3g.71gb") == pytest.approx(3 / 7)  # SMs unknown: slices
    assert sm_fraction("NVIDIA Mystery", 0, None) == 1.0  # nothing known: a whole GPU
