"""The example keeps its promise: a training script becomes a consumer by changing at most 3 lines."""

from __future__ import annotations

import difflib
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "shared_loading"


def _code(path: Path) -> list[str]:
    lines = path.read_text().splitlines()
    return lines[1:]  # the first line is the docstring that explains the difference


def test_consumer_script_differs_from_the_original_by_at_most_three_lines() -> None:
    diff = [line for line in difflib.unified_diff(_code(EXAMPLE / "train.py"), _code(EXAMPLE / "train_shared.py"),
                                                  lineterm="", n=0)
            if line.startswith("+") and not line.startswith("+++")]
    assert 1 <= len(diff) <= 3, diff
    assert any("share.SharedLoader(" in line for line in diff)
