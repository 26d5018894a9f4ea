from pathlib import Path

import pytest

SHARED_DATA = Path(__file__).resolve().parents[3] / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The traces and catalogue in ../shared/data (read in place, never copied)."""
    if not (SHARED_DATA / "carma-workloads.csv").exists():
        pytest.fail(f"expected the shared data folder beside the checkout at {SHARED_DATA}")
    return SHARED_DATA
