"""Session-wide clean-up shared by every test folder."""

from __future__ import annotations

import os
import sys

import pytest

#: Every daemon a test starts (``collocate serve`` in a subprocess, anywhere under tests/) keeps
#: no warm estimator: each would import torch and trace two models, tens of seconds of CPU on a
#: 2-core machine, for tests that never estimate. The test of the default unsets it
#: (``daemon/test_e2e_warm_estimator.py``); a test that wants one passes ``--warm-estimator``.
os.environ["COLLOCATE_NO_WARM_ESTIMATOR"] = "1"


def pytest_unconfigure(config) -> None:  # noqa: ARG001 - pytest's hook signature
    """Remove the lab's mirrors of paths members could not reach (``lab_harness.member_paths``),
    in each xdist worker and in a plain run alike."""
    harness = sys.modules.get("lab_harness")
    if harness is not None:
        harness.remove_mirrors()


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the groups to place tests
def pytest_collection_modifyitems(config, items) -> None:  # noqa: ARG001 - pytest's hook signature
    """Tests that start a local Ray cluster run on one xdist worker (``--dist loadgroup``): two
    clusters starting at once on one machine compete for Ray's ports and its start-up time, and
    the session's cluster (``tests/cluster/conftest.py``) then starts once, on that worker only,
    instead of idling on every worker for the rest of the run. Tests that need no Ray stay free."""
    for item in items:
        if "ray_cluster" in getattr(item, "fixturenames", ()) or item.name.startswith(
                "test_a_real_three_node_ray_cluster"):
            item.add_marker(pytest.mark.xdist_group("ray"))
