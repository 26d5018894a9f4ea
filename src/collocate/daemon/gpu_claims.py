"""One daemon per GPU: a system-wide registry of which collocate daemon manages which GPU.

Two schedulers on one GPU each believe the GPU is theirs: both place jobs by its free memory and
both lose. So at start a daemon claims each GPU it manages (by UUID; a MIG instance by its
parent GPU) in ``/run/collocate/gpus/`` (``COLLOCATE_GPU_REGISTRY`` names another folder): one
file per GPU holding the claiming daemon's state directory and pid, locked (``flock``) for the
daemon's life. A second ``serve`` on a claimed GPU refuses to start and names the first one's
state directory. The lock, not the file, is the claim: a daemon that died (even by SIGKILL)
holds no lock, so its file blocks nobody and is taken over.

The registry folder is root's (0755): a daemon that cannot write there (a member's own daemon)
still checks it, so it never starts on a lab's GPUs, but does not claim. Emulated GPUs live in
their daemon's state directory, so two daemons never share them; they are claimed only in a
registry named with ``COLLOCATE_GPU_REGISTRY`` (how the tests exercise this with emulated GPUs).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
from collections.abc import Iterable
from pathlib import Path

from collocate.common.errors import CollocateError

ENV_REGISTRY = "COLLOCATE_GPU_REGISTRY"
SYSTEM_REGISTRY = Path("/run/collocate/gpus")
_EMULATED = ("GPU-emu-", "MIG-emu-")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def registry_dir(uuids: Iterable[str]) -> Path | None:
    """Where these GPUs are claimed: ``COLLOCATE_GPU_REGISTRY``, else the system folder for real
    GPUs; None (no claim) for emulated ones without a named registry."""
    named = os.environ.get(ENV_REGISTRY)
    if named:
        return Path(named)
    if all(u.startswith(_EMULATED) for u in uuids):
        return None
    return SYSTEM_REGISTRY


class GpuClaims:
    """The claims one daemon holds (file descriptors kept open, so locked, until ``release``)."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = Path(state_dir)
        self._fds: list[int] = []

    def claim(self, uuids: Iterable[str]) -> None:
        """Refuse (``CollocateError`` naming the other daemon's state dir) if another live daemon
        manages any of ``uuids``; claim them all where the registry is writable."""
        wanted = sorted(set(uuids))
        folder = registry_dir(wanted)
        if folder is None or not wanted:
            return
        for uuid in wanted:
            self._check(folder / _file_name(uuid), uuid)
        try:
            folder.mkdir(mode=0o755, parents=True, exist_ok=True)
        except OSError:
            return  # not ours to create (a member's daemon): checked, not claimed
        if not os.access(folder, os.W_OK):
            return
        for uuid in wanted:
            path = folder / _file_name(uuid)
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
            except OSError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                self.release()
                self._check(path, uuid)  # raises, naming the daemon that won the race
                raise CollocateError(f"GPU {uuid} was claimed by another collocate daemon just now") from None
            os.ftruncate(fd, 0)
            os.write(fd, json.dumps({"uuid": uuid, "state_dir": str(self.state_dir),
                                     "pid": os.getpid()}).encode() + b"\n")
            self._fds.append(fd)

    def _check(self, path: Path, uuid: str) -> None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return  # no claim (or not a file we follow)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _holder(fd)
                if holder.get("state_dir") == str(self.state_dir) and holder.get("pid") == os.getpid():
                    return
                raise CollocateError(
                    f"GPU {uuid} is already managed by another collocate daemon (state dir "
                    f"{holder.get('state_dir', '?')}, pid {holder.get('pid', '?')}); two schedulers "
                    "on one GPU would both place jobs on memory the other uses",
                    hint="use that daemon (`collocate --state-dir DIR ls`), stop it first, or "
                         "give this one other GPUs (CUDA_VISIBLE_DEVICES)") from None
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def release(self) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds = []


def _holder(fd: int) -> dict:
    try:
        data = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _file_name(uuid: str) -> str:
    return _UNSAFE.sub("_", uuid)[:200] + ".lock"
