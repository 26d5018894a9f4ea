"""Resolve ``module:factory`` specs (as uvicorn and torchx do) into a loader."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterable
from typing import Any

from collocate.common.errors import InputError


def load_factory(spec: str) -> Any:
    """Import ``module:attr``; the current directory is searched first, like ``python -m``."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise InputError(f"loader factory {spec!r} is not of the form module:factory",
                         hint="e.g. `my_project.data:make_train_loader` (a function returning a DataLoader)")
    if "" not in sys.path:
        sys.path.insert(0, "")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise InputError(f"cannot import module {module_name!r} of {spec!r}: {exc}",
                         hint="run from the directory that contains it, or set PYTHONPATH") from None
    target: Any = module
    for part in attr.split("."):
        if not hasattr(target, part):
            raise InputError(f"module {module_name!r} has no attribute {attr!r}",
                             hint=f"names defined there: {', '.join(n for n in dir(module) if not n.startswith('_'))}")
        target = getattr(target, part)
    return target


def build_loader(spec: str) -> Iterable[Any]:
    """Call the factory (or take the object) and check the result can be iterated."""
    target = load_factory(spec)
    loader = target() if callable(target) and not hasattr(target, "__iter__") else target
    if not hasattr(loader, "__iter__"):
        raise InputError(f"{spec} returned a {type(loader).__name__}, which is not iterable",
                         hint="return a DataLoader or another iterable of tensor batches")
    return loader
