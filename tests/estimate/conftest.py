"""Make the helper entry points in ``_entries.py`` importable as ``_entries:<name>``."""

from __future__ import annotations

import pathlib
import sys

HERE = pathlib.Path(__file__).parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
