"""Start, probe and stop producers as subprocesses: the API the daemon uses.

The daemon starts one producer per dataset name before the first job that declared it runs,
waits until it is ready, and stops it after the last such job ends. A producer is found by
(name, state directory) alone (see ``naming``), so the daemon needs no file of its own; the
``argv`` of a spec is pure, so a dry run can print the exact command it would launch.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from collocate.common.errors import InputError
from collocate.share import naming
from collocate.share.errors import ProducerLostError, ProtocolError, ShareError
from collocate.share.protocol import Msg, decode, encode, recv, send


@dataclass(frozen=True)
class ProducerSpec:
    """Everything needed to launch a producer: ``factory`` is ``module:callable`` returning a loader."""

    factory: str
    name: str
    state_dir: str | None = None
    slots: int = 8
    stall_timeout_s: float = 10.0
    consumer_timeout_s: float = 5.0
    samples_per_epoch: int | None = None
    device: str = "cpu"
    python: str = field(default_factory=lambda: sys.executable)

    def __post_init__(self) -> None:
        naming.validate_name(self.name)
        if ":" not in self.factory:
            raise InputError(f"factory {self.factory!r} is not module:callable",
                             hint="e.g. my_project.data:make_train_loader")

    def argv(self) -> list[str]:
        """The exact command line of the producer process."""
        args = [self.python, "-m", "collocate.share", "serve", self.factory, "--name", self.name,
                "--slots", str(self.slots), "--stall-timeout", str(self.stall_timeout_s),
                "--consumer-timeout", str(self.consumer_timeout_s), "--device", self.device]
        if self.state_dir is not None:
            args += ["--state-dir", str(self.state_dir)]
        if self.samples_per_epoch is not None:
            args += ["--samples-per-epoch", str(self.samples_per_epoch)]
        return args


@dataclass(frozen=True)
class ProducerStatus:
    """What a running producer reports about itself."""

    name: str
    pid: int
    ready: bool  # the first batch is in the ring: consumers can attach
    consumers: int
    batches: int
    samples: int
    error: str | None


def probe(name: str, state_dir: str | os.PathLike[str] | None = None, timeout: float = 1.0) -> ProducerStatus | None:
    """Ask the producer ``name`` for its status; ``None`` if none is listening."""
    address = naming.socket_address(name, state_dir)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    sock.settimeout(timeout)
    try:
        try:
            sock.connect(address)
        except (FileNotFoundError, ConnectionRefusedError):
            return None
        send(sock, encode(Msg.STATUS))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            data, fds = recv(sock)
            for fd in fds:
                os.close(fd)
            if not data:
                return None
            kind, body = decode(data)
            if kind is Msg.STATUS and isinstance(body, dict):
                return ProducerStatus(str(body.get("name")), int(body.get("pid", 0)), bool(body.get("ready")),
                                      int(body.get("consumers", 0)), int(body.get("batches", 0)),
                                      int(body.get("samples", 0)), body.get("error"))
        return None
    except (OSError, ProtocolError):
        return None
    finally:
        sock.close()


class ProducerHandle:
    """A producer subprocess started by ``start_producer``."""

    def __init__(self, spec: ProducerSpec, process: subprocess.Popen[bytes]) -> None:
        self.spec, self.process = spec, process

    @property
    def pid(self) -> int:
        return self.process.pid

    def is_alive(self) -> bool:
        return self.process.poll() is None

    def wait_ready(self, timeout: float = 60.0) -> ProducerStatus:
        """Block until the producer has its first batch in the ring (consumers attach instantly)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.is_alive():
                raise ProducerLostError(
                    f"producer {self.spec.name!r} exited with code {self.process.returncode} before it was ready",
                    hint="see its log (log_path=) for the loader's error")
            status = probe(self.spec.name, self.spec.state_dir)
            if status is not None and status.pid == self.pid and status.ready:
                return status
            time.sleep(0.1)
        raise ShareError(f"producer {self.spec.name!r} was not ready within {timeout:g} s",
                         hint="its loader may be slow to yield the first batch; raise timeout or check its log")

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM (graceful: consumers get a clear error), then SIGKILL after ``timeout``; returns the exit code."""
        if self.is_alive():
            self.process.send_signal(signal.SIGTERM)
            try:
                return self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
        return self.process.wait(timeout)


def start_producer(spec: ProducerSpec, *, log_path: str | os.PathLike[str] | None = None,
                   cwd: str | os.PathLike[str] | None = None, env: dict[str, str] | None = None,
                   argv_prefix: tuple[str, ...] = ()) -> ProducerHandle:
    """Launch ``spec`` as a subprocess (argv list, no shell); refuses if the name is already served.

    ``argv_prefix`` runs the producer through a launcher (the daemon's ``collocate.node.isolate``,
    which drops to the job's user before the factory's code is imported)."""
    existing = probe(spec.name, spec.state_dir)
    if existing is not None:
        from collocate.share.errors import ProducerExistsError

        raise ProducerExistsError(f"producer {spec.name!r} is already running (pid {existing.pid})",
                                  hint="reuse it, or stop it before starting another")
    argv = [*argv_prefix, *spec.argv()]
    if log_path is None:
        process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, cwd=cwd, env=env, start_new_session=True)
    else:
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:  # the child keeps its own copy of the descriptor
            process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       cwd=cwd, env=env, start_new_session=True)
    return ProducerHandle(spec, process)
