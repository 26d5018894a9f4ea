"""Session-wide clean-up shared by every test folder."""

from __future__ import annotations

import sys


def pytest_unconfigure(config) -> None:  # noqa: ARG001 - pytest's hook signature
    """Remove the lab's mirrors of paths members could not reach (``lab_harness.member_paths``),
    in each xdist worker and in a plain run alike."""
    harness = sys.modules.get("lab_harness")
    if harness is not None:
        harness.remove_mirrors()


def pytest_collection_modifyitems(config, items) -> None:  # noqa: ARG001 - pytest's hook signature
    """Tests that start a local Ray cluster run on one xdist worker (``--dist loadgroup``): two
    clusters starting at once on one machine compete for Ray's ports and its start-up time."""
    import pytest

    for item in items:
        path = str(item.path)
        if "/tests/cluster/" in path or item.path.name == "test_slurm_recipe.py":
            item.add_marker(pytest.mark.xdist_group("ray"))
