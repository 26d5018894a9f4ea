"""matplotlib is an optional extra: without it, drawing a plot says how to install it."""

from __future__ import annotations

import sys

import pytest

from collocate.common.errors import CollocateError
from collocate.common.plotting import pyplot


def test_plots_without_matplotlib_name_the_extra(monkeypatch) -> None:
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    with pytest.raises(CollocateError) as err:
        pyplot()
    assert "pip install 'collocate[plots]'" in str(err.value)


def test_plots_with_matplotlib_draw_to_files_only() -> None:
    pytest.importorskip("matplotlib")
    plt = pyplot()
    assert plt.get_backend().lower() == "agg"
