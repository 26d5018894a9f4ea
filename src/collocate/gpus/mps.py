"""NVIDIA MPS for the daemon: start and stop one control daemon, and each job's MPS environment.

The control daemon runs as the user who starts the collocate daemon, with its pipe and log
directories under the daemon's state directory (so no root and no clash with an admin's MPS).
MPS serves one user at a time: the control daemon runs one MPS server per UID and queues clients
of another user until the current server's clients are gone, so collocation under MPS only
happens between jobs of the same user. We never change the GPU compute mode (an admin may set
EXCLUSIVE_PROCESS as NVIDIA recommends; MPS also works in DEFAULT mode).

All process access goes through ``runner`` (``subprocess.run`` by default) so tests can swap in
a fake; commands are argv lists and their exit codes are checked.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from collocate.common.errors import CollocateError, InputError

CONTROL_BINARY = "nvidia-cuda-mps-control"
SERVER_COMM = "nvidia-cuda-mps"  # /proc/<pid>/comm of nvidia-cuda-mps-server (cut at 15 bytes)
DEFAULT_MEM_MARGIN_MIB = 512.0  # headroom over the requirement; CARMA keeps 512 MiB free too
COMMAND_TIMEOUT_S = 30.0

Runner = Callable[..., subprocess.CompletedProcess]


@dataclass(frozen=True, slots=True)
class MpsDirs:
    pipe: Path
    log: Path

    @classmethod
    def under(cls, state_dir: Path) -> MpsDirs:
        return cls(Path(state_dir) / "mps" / "pipe", Path(state_dir) / "mps" / "log")

    def env(self) -> dict[str, str]:
        return {"CUDA_MPS_PIPE_DIRECTORY": str(self.pipe), "CUDA_MPS_LOG_DIRECTORY": str(self.log)}


def default_sharing(*, gpus: str, serves_others: bool, ray: bool,
                    which: Callable[[str], str | None] = shutil.which) -> tuple[str, str]:
    """What ``collocate serve --sharing auto`` (the default) runs, and why.

    MPS where it pays and is safe: on the H100 the calibrated models give a 14-job first run a
    floor of 0.36x exclusive under MPS against 0.48x time-sliced, four 1-GiB MLPs ran 1.9x the
    throughput of one under MPS, and MPS enforces each job's memory limit (docs/gpus.md,
    "Sharing by default"). But one MPS server serves one user at a time (jobs of two users on one
    GPU would be serialised, and the core then keeps each GPU to one user's jobs), so a daemon
    that serves a group (``--group``) or several nodes (``--ray``: their agents start MPS per
    node, which the head cannot check) time-slices unless told ``--sharing mps``; and MPS needs
    NVIDIA's control daemon on the machine (emulated GPUs model it)."""
    if serves_others:
        return "time-slicing", "the daemon serves a group: MPS would serialise its members' jobs"
    if ray:
        return "time-slicing", "several nodes: choose MPS for them with --sharing mps"
    if gpus.startswith("emulated"):
        return "mps", "one user's jobs; emulated GPUs model MPS"
    if which(CONTROL_BINARY) is None:
        return "time-slicing", f"{CONTROL_BINARY} is not installed"
    return "mps", "one user's jobs, with per-job memory limits"


def active_thread_percentage(sm_share: float) -> int:
    """``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` for a share of the GPU's SMs, clamped to 1..100."""
    if not math.isfinite(sm_share):
        raise InputError(
            f"SM share must be a number, got {sm_share!r}", hint="use a fraction in (0, 1]"
        )
    return max(1, min(100, math.ceil(sm_share * 100 - 1e-9)))


def pinned_mem_limit(
    mem_mib: float, devices: Sequence[str] = ("0",), *, margin_mib: float = DEFAULT_MEM_MARGIN_MIB
) -> str:
    """``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``: ``<dev>=<N>M`` per device, comma-joined.

    ``devices`` are as the client sees them: ordinals ``0..n-1`` of its ``CUDA_VISIBLE_DEVICES``
    (NVIDIA documents ``0=1G``; UUIDs also name devices there, and the several-device syntax is
    not confirmed by NVIDIA's text). ``N`` is the requirement plus ``margin_mib``, rounded up.
    """
    if not math.isfinite(mem_mib) or mem_mib <= 0:
        raise InputError(f"memory requirement must be > 0 MiB, got {mem_mib!r}",
                         hint="give the job a memory requirement before running it under MPS")
    if not devices:
        raise InputError("no devices for the MPS memory limit", hint="pass at least one device")
    limit = math.ceil(mem_mib + max(0.0, margin_mib))
    return ",".join(f"{d}={limit}M" for d in devices)


def mps_client_env(
    *,
    dirs: MpsDirs,
    sm_share: float | None = None,
    mem_mib: float | None = None,
    devices: Sequence[str] = ("0",),
    margin_mib: float = DEFAULT_MEM_MARGIN_MIB,
) -> dict[str, str]:
    """The environment a job gets under MPS (pure: the launcher merges it into the job's env).

    ``mem_mib`` comes from the placement (``Placement.mem_mib``); ``sm_share`` is a thread cap
    the daemon does not set (no policy asks for one). Either may be None: that limit is not set.
    """
    env = dirs.env()
    if sm_share is not None:
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(active_thread_percentage(sm_share))
    if mem_mib is not None:
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = pinned_mem_limit(
            mem_mib, devices, margin_mib=margin_mib
        )
    return env


def is_mps_server(pid: int) -> bool:
    """Whether ``pid`` is an MPS server. NVML lists the server among a GPU's processes, with its
    own memory (66 MiB on an H100) and, where it reports per-process utilization, all of its
    clients' (docs/gpu-validation.md), so it must not count as a job's neighbour."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() == SERVER_COMM
    except OSError:  # gone, or another pid namespace: not ours to recognise
        return False


class MpsControl:
    """Starts and stops ``nvidia-cuda-mps-control`` with directories under ``state_dir``."""

    def __init__(
        self,
        state_dir: Path,
        *,
        binary: str = CONTROL_BINARY,
        runner: Runner = subprocess.run,
        which: Callable[[str], str | None] | None = None,
        base_env: Mapping[str, str] | None = None,
    ) -> None:
        """``base_env`` (default: this process's) is the environment the binary runs with; the
        binary is looked up on its PATH unless ``which`` is given."""
        self.dirs = MpsDirs.under(state_dir)
        self.binary, self.runner = binary, runner
        self.base_env = dict(os.environ if base_env is None else base_env)
        self.which = which or (lambda b: shutil.which(b, path=self.base_env.get("PATH")))

    def start(self) -> None:
        """Start the control daemon (``-d`` forks it into the background); errors say why."""
        for d in (self.dirs.pipe, self.dirs.log):
            d.mkdir(parents=True, exist_ok=True)
        self._run(["-d"], stdin=None, what="start the MPS control daemon")

    def stop(self) -> None:
        """Ask the control daemon to quit (``echo quit | nvidia-cuda-mps-control``)."""
        self._run([], stdin="quit\n", what="stop the MPS control daemon")

    def client_env(self, **kwargs: object) -> dict[str, str]:
        """``mps_client_env`` with this daemon's directories."""
        return mps_client_env(dirs=self.dirs, **kwargs)  # type: ignore[arg-type]

    def _run(self, args: list[str], *, stdin: str | None, what: str) -> None:
        path = self.which(self.binary)
        if path is None:
            raise CollocateError(
                f"cannot {what}: {self.binary} is not installed or not on PATH",
                hint="install the NVIDIA driver utilities (MPS ships with the driver), or use "
                "--sharing time-slicing",
            )
        env = {**self.base_env, **self.dirs.env()}
        env.pop("CUDA_VISIBLE_DEVICES", None)  # the daemon must see every GPU under its real ids
        try:
            result = self.runner(
                [path, *args], input=stdin, env=env, capture_output=True, text=True,
                timeout=COMMAND_TIMEOUT_S, check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise CollocateError(f"cannot {what}: {exc}", hint=self._log_hint()) from exc
        if result.returncode != 0:
            detail = (result.stderr or result.stdout or "").strip()
            raise CollocateError(
                f"cannot {what}: {self.binary} exited with status {result.returncode}"
                + (f": {detail}" if detail else ""),
                hint=self._log_hint(),
            )

    def _log_hint(self) -> str:
        return f"see the MPS logs in {self.dirs.log} (control.log, server.log)"
