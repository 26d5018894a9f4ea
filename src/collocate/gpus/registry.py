"""``--gpus`` names → GPU backends: ``nvml``, ``emulated:<spec>`` and ``auto``.

A name → factory table (lazy: NVML is only imported when asked for), so the daemon and the CLI
open a backend from one string and errors list the valid names.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from collocate.common.errors import InputError, UnknownNameError
from collocate.gpus.base import GpuBackend
from collocate.gpus.nvml import EMULATED_HINT, NoGpuError

SPEC_HELP = (
    "nvml, auto, or emulated:<count>x<type>[:mig<i>=<profile>,...] (e.g. emulated:4xA100-40GB)"
)


def _nvml(arg: str, state_dir: Path, node: str) -> GpuBackend:
    from collocate.gpus.nvml import NvmlBackend
    from collocate.gpus.visible import visible_from_env

    return NvmlBackend(node=node, visible=visible_from_env(os.environ))


def _emulated(arg: str, state_dir: Path, node: str) -> GpuBackend:
    from collocate.gpus.emulated import EmulatedBackend

    if not arg:
        raise InputError("emulated GPUs need a spec", hint="write e.g. --gpus emulated:4xA100-40GB")
    return EmulatedBackend.create(emulated_state_dir(state_dir), arg, node=node)


def _auto(arg: str, state_dir: Path, node: str) -> GpuBackend:
    from collocate.gpus.nvml import nvml_available

    if not nvml_available():
        raise NoGpuError(
            "no GPU found: the NVIDIA driver (NVML) is not available", hint=EMULATED_HINT
        )
    return _nvml(arg, state_dir, node)


BACKENDS: dict[str, Callable[[str, Path, str], GpuBackend]] = {
    "nvml": _nvml,
    "emulated": _emulated,
    "auto": _auto,
}


def emulated_state_dir(state_dir: Path) -> Path:
    """Where ``open_backend`` keeps emulated GPU state: set ``COLLOCATE_EMULATED_DIR`` to this."""
    return Path(state_dir) / "emulated"


def open_backend(spec: str, *, state_dir: Path, node: str) -> GpuBackend:
    """Open the backend ``spec`` names (``nvml``, ``auto``, ``emulated:4xA100-40GB``...).

    ``state_dir`` is the daemon's state directory (emulated GPUs live in
    ``emulated_state_dir(state_dir)``); ``node`` names this machine in every ``GpuId``.
    """
    name, _, arg = spec.strip().partition(":")
    name = name.strip().lower()
    factory = BACKENDS.get(name)
    if factory is None:
        raise UnknownNameError("GPU backend", name, list(BACKENDS))
    if arg and name != "emulated":
        raise InputError(f"GPU backend {name!r} takes no argument, got {spec!r}", hint=SPEC_HELP)
    return factory(arg.strip(), Path(state_dir), node)
