"""Load a user's entry point and check what it returns.

The contract (issue #4): a callable taking ``batch_size=N`` that returns
``(model, example_batch, optimizer)`` or ``(model, example_batch, optimizer, loss_fn)``.
``example_batch`` is ``(inputs, targets)``, where ``inputs`` is a tensor, a tuple of tensors
(positional arguments) or a dict (keyword arguments) and ``targets`` a tensor or ``None``; a bare
tensor or dict means inputs without targets. Every mistake is reported as an ``InputError`` that
names the cause and the fix, because this is the edge where users' code meets ours.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from collocate.common.errors import CollocateError, InputError, UnknownNameError

CONTRACT_HINT = (
    "the entry point must be `def build(batch_size: int)` returning "
    "(model: nn.Module, batch, optimizer) or (model, batch, optimizer, loss_fn), "
    "with batch = (inputs, targets); see examples/estimate_entrypoint.py"
)

OPTIMIZERS = ("sgd", "adam", "adamw")
PRECISIONS = ("fp32", "fp16", "bf16")


@dataclass
class Workload:
    """What an entry point returned, validated."""

    model: Any  # torch.nn.Module
    inputs: Any  # Tensor | tuple[Tensor, ...] | dict[str, Tensor]
    targets: Any  # Tensor | None
    optimizer: Any  # torch.optim.Optimizer
    loss_fn: Callable[..., Any] | None


def check_batch_size(batch_size: object) -> int:
    """Reject non-positive or non-integer batch sizes with the fix."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
        raise InputError(
            f"batch size must be a positive integer, got {batch_size!r}",
            hint="pass --batch-size N with N >= 1 (the per-GPU batch the job trains with)",
        )
    return batch_size


def check_choice(kind: str, value: str | None, valid: tuple[str, ...]) -> str | None:
    """Normalise an option such as the optimizer or precision name, or raise with the choices."""
    if value is None:
        return None
    v = value.lower()
    if v not in valid:
        raise UnknownNameError(kind, value, valid)
    return v


def import_from_here(mod_name: str) -> ModuleType:
    """Import ``mod_name`` with the current directory on ``sys.path``, as ``python -m`` and
    ``python script.py`` users expect: ``collocate estimate mymod:build`` run beside ``mymod.py``
    finds it, as ``submit --estimate`` (a ``python -m`` child started there) always did."""
    here = os.getcwd()
    if "" not in sys.path and here not in sys.path:
        sys.path.insert(0, here)  # kept: the entry point may import its siblings later
    return importlib.import_module(mod_name)


def resolve(entry: str | Callable[..., Any]) -> Callable[..., Any]:
    """Turn ``"pkg.module:function"`` into the callable; pass callables through."""
    if callable(entry):
        return entry
    if not isinstance(entry, str) or entry.count(":") != 1:
        raise InputError(
            f"entry point {entry!r} is not of the form 'package.module:function'",
            hint="for example: collocate estimate mypkg.models:build --batch-size 64",
        )
    mod_name, func_name = entry.split(":")
    if not mod_name or not func_name:
        raise InputError(
            f"entry point {entry!r} is missing the module or the function name",
            hint="write it as 'package.module:function'",
        )
    try:
        module = import_from_here(mod_name)
    except ImportError as exc:
        raise InputError(
            f"cannot import module {mod_name!r} of entry point {entry!r} from {os.getcwd()}: {exc}",
            hint="check the spelling, run from the directory that holds the module (or its "
            "package) or add that directory to PYTHONPATH, and install the module's dependencies",
        ) from exc
    except Exception as exc:
        raise CollocateError(
            f"importing {mod_name!r} raised {type(exc).__name__}: {exc}",
            hint="fix the error in that module; it must import without side effects",
        ) from exc
    func = getattr(module, func_name, None)
    if func is None:
        public = [n for n in dir(module) if not n.startswith("_") and callable(getattr(module, n))]
        raise InputError(
            f"module {mod_name!r} has no attribute {func_name!r}",
            hint=f"callables it defines: {', '.join(sorted(public)[:20]) or 'none'}",
        )
    if not callable(func):
        raise InputError(f"{entry!r} is not callable", hint=CONTRACT_HINT)
    return func


def call(func: Callable[..., Any], batch_size: int) -> tuple[Any, ...]:
    """Call the entry point with ``batch_size=`` and return its raw result."""
    name = getattr(func, "__qualname__", repr(func))
    try:
        inspect.signature(func).bind(batch_size=batch_size)
    except TypeError as exc:
        raise InputError(
            f"entry point {name} cannot be called with batch_size=: {exc}", hint=CONTRACT_HINT
        ) from exc
    except ValueError:
        pass  # builtins without a signature: just try the call
    try:
        result = func(batch_size=batch_size)
    except CollocateError:
        raise
    except Exception as exc:
        where = traceback.extract_tb(exc.__traceback__)[-1]
        raise CollocateError(
            f"entry point {name}(batch_size={batch_size}) raised {type(exc).__name__}: {exc} "
            f"({where.filename}:{where.lineno})",
            hint="fix the entry point so it runs on CPU without a GPU; estimation calls it "
            "with fake tensors first and on CPU when that fails",
        ) from exc
    if not isinstance(result, tuple | list):
        raise InputError(
            f"entry point {name} returned {type(result).__name__}, not a tuple", hint=CONTRACT_HINT
        )
    return tuple(result)


def validate(result: tuple[Any, ...], *, name: str = "entry point") -> Workload:
    """Check the shape of an entry point's result and split the batch into inputs/targets."""
    import torch
    from torch import nn

    if len(result) not in (3, 4):
        raise InputError(f"{name} returned {len(result)} items, expected 3 or 4", hint=CONTRACT_HINT)
    model, batch, optimizer = result[:3]
    loss_fn = result[3] if len(result) == 4 else None
    if not isinstance(model, nn.Module):
        raise InputError(
            f"{name}: first item is {type(model).__name__}, not a torch.nn.Module", hint=CONTRACT_HINT
        )
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise InputError(
            f"{name}: third item is {type(optimizer).__name__}, not a torch.optim.Optimizer",
            hint="return the optimizer you train with, or None together with --optimizer",
        )
    if loss_fn is not None and not callable(loss_fn):
        raise InputError(f"{name}: fourth item (loss) is not callable", hint=CONTRACT_HINT)
    if isinstance(batch, torch.Tensor | dict):
        inputs, targets = batch, None
    elif isinstance(batch, tuple | list) and len(batch) == 2:
        inputs, targets = batch
    else:
        raise InputError(
            f"{name}: batch is {type(batch).__name__}"
            + (f" of length {len(batch)}" if isinstance(batch, tuple | list) else ""),
            hint="return the batch as (inputs, targets), a tensor, or a dict of tensors",
        )
    if targets is not None and not isinstance(targets, torch.Tensor):
        raise InputError(f"{name}: targets are {type(targets).__name__}, not a tensor", hint=CONTRACT_HINT)
    ok_inputs = (
        isinstance(inputs, torch.Tensor)
        or (isinstance(inputs, tuple | list) and all(isinstance(t, torch.Tensor) for t in inputs))
        or (isinstance(inputs, dict) and all(isinstance(k, str) for k in inputs))
    )
    if not ok_inputs:
        raise InputError(
            f"{name}: inputs are {type(inputs).__name__}",
            hint="inputs must be a tensor, a tuple of tensors, or a dict of keyword arguments",
        )
    if not any(p.requires_grad for p in model.parameters()):
        raise InputError(f"{name}: the model has no trainable parameters", hint=CONTRACT_HINT)
    return Workload(model, inputs, targets, optimizer, loss_fn)


def make_optimizer(name: str, params: Any, *, lr: float = 1e-3) -> Any:
    """Build the optimizer named by ``--optimizer`` (SGD uses momentum 0.9, as most recipes)."""
    import torch

    key = check_choice("optimizer", name, OPTIMIZERS)
    if key == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.9)
    if key == "adam":
        return torch.optim.Adam(params, lr=lr)
    return torch.optim.AdamW(params, lr=lr)


def load(
    entry: str | Callable[..., Any], batch_size: int, optimizer: str | None = None
) -> Workload:
    """Resolve, call and validate an entry point; replace the optimizer when one is named."""
    func = resolve(entry)
    work = validate(call(func, batch_size), name=str(getattr(func, "__qualname__", entry)))
    if optimizer is not None:
        work.optimizer = make_optimizer(optimizer, work.model.parameters())
    elif work.optimizer is None:
        raise InputError(
            "the entry point returned no optimizer and none was named",
            hint=f"return one from the entry point or pass --optimizer ({'/'.join(OPTIMIZERS)})",
        )
    return work
