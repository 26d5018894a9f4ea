"""Shared datasets: one producer per ``--dataset`` name, alive while any job of it is queued or runs.

Jobs submitted with ``--dataset NAME`` read their batches from a ``collocate.share`` producer
instead of each running its own DataLoader. The daemon owns that producer's life:

* at submit, ``resolve_factory`` fills in the ``module:factory`` from earlier jobs of the same
  name (only the first job has to give it) and refuses a different one while the dataset is in
  use: two factories cannot share one name;
* at launch, ``ensure`` starts the producer (the job's cwd and environment, so the factory
  imports as it would in the job) and waits, bounded, until its first batch is ready; the job
  gets ``COLLOCATE_DATASET`` and ``COLLOCATE_SHARE_DIR`` (``SharedLoader`` reads the latter);
* every round, ``reconcile`` stops producers whose dataset has no pending or running job left.
  Stopping only sends SIGTERM; a later round reaps the process (SIGKILL after a grace period),
  so the loop never waits on a producer's shutdown.

Producers are found by (name, share dir) alone (``collocate.share.naming``), so across a daemon
restart ``adopt`` probes each known name: a live producer is kept (and stopped by pid later), a
dead one is simply started again when the next job of its dataset launches.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import psutil

from collocate.daemon.spec import JobSpec
from collocate.errors import CollocateError, InputError
from collocate.model import Job

log = logging.getLogger("collocate.daemon")

ENV_DATASET = "COLLOCATE_DATASET"
ENV_SHARE_DIR = "COLLOCATE_SHARE_DIR"  # read by ``SharedLoader`` when no state_dir is given
READY_TIMEOUT_S = 30.0  # the loop blocks at most this long for a producer's first batch
STOP_GRACE_S = 10.0  # SIGTERM, then SIGKILL after this


class ProducerStartError(CollocateError):
    """A producer did not come up; the message names its log, the job fails with it."""


@dataclass(slots=True)
class _Producer:
    name: str
    factory: str | None  # None when adopted after a restart (only its name is known)
    pid: int
    handle: object | None = None  # ProducerHandle when this daemon started it
    stop_at: float | None = None  # when SIGTERM was sent

    def alive(self) -> bool:
        if self.handle is not None:
            return self.handle.is_alive()  # type: ignore[attr-defined]
        try:  # adopted: not our child, so it may linger as a zombie until init reaps it
            return psutil.Process(self.pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False
        except psutil.Error:
            return True


def active_factories(jobs: Iterable[Job], specs: Mapping[str, JobSpec]) -> dict[str, str]:
    """``dataset -> factory`` of the datasets that pending or running jobs use."""
    out: dict[str, str] = {}
    for job in jobs:
        spec = specs.get(job.id)
        if spec is not None and spec.dataset and not job.state.is_terminal and spec.dataset_factory:
            out.setdefault(spec.dataset, spec.dataset_factory)
    return out


def resolve_factory(spec: JobSpec, jobs: Iterable[Job], specs: Mapping[str, JobSpec]) -> str:
    """The factory ``spec``'s dataset is served with; raises ``InputError`` when it is missing
    (first job of the name) or differs from the one the dataset's active jobs use.

    Remembered per name: the active jobs' factory first, else the most recent job's."""
    assert spec.dataset is not None
    jobs = list(jobs)
    active = active_factories(jobs, specs).get(spec.dataset)
    if spec.dataset_factory is not None:
        if active is not None and active != spec.dataset_factory:
            raise InputError(
                f"dataset {spec.dataset!r} is already served by {active}, not {spec.dataset_factory}",
                hint=f"drop --dataset-factory (or pass {active}), or use another --dataset name")
        return spec.dataset_factory
    if active is not None:
        return active
    for job in reversed(jobs):
        earlier = specs.get(job.id)
        if earlier is not None and earlier.dataset == spec.dataset and earlier.dataset_factory:
            return earlier.dataset_factory
    raise InputError(f"dataset {spec.dataset!r} is new to this daemon, so it needs a factory",
                     hint="add --dataset-factory module:factory (a function returning the "
                          "DataLoader to share, as `collocate share serve` takes)")


class Datasets:
    """The producers this daemon runs, keyed by dataset name (loop thread only)."""

    def __init__(self, root: Path, *, ready_timeout_s: float = READY_TIMEOUT_S) -> None:
        self.share_dir = root / "share"  # only hashed into socket names; logs live here too
        self.ready_timeout_s = ready_timeout_s
        self.producers: dict[str, _Producer] = {}

    def log_path(self, name: str) -> Path:
        return self.share_dir / f"{name}.log"

    def job_env(self, name: str) -> dict[str, str]:
        return {ENV_DATASET: name, ENV_SHARE_DIR: str(self.share_dir)}

    def adopt(self, names: Iterable[str]) -> None:
        """After a restart: keep the producers of these names that still answer."""
        from collocate.share.lifecycle import probe

        for name in sorted(set(names)):
            status = probe(name, self.share_dir, timeout=1.0)
            if status is not None and name not in self.producers:
                self.producers[name] = _Producer(name, None, status.pid)
                log.info("re-adopted producer %r (pid %d)", name, status.pid)

    def ensure(self, spec: JobSpec) -> None:
        """Make sure ``spec``'s dataset is served, starting its producer if needed.

        Raises ``ProducerStartError`` (naming the log) when it cannot start or is not ready in
        ``ready_timeout_s``; what is left of it is killed so the next launch starts clean.
        """
        from collocate.share.errors import ProducerExistsError, ShareError
        from collocate.share.lifecycle import ProducerSpec, probe, start_producer

        name, factory = spec.dataset, spec.dataset_factory
        assert name is not None
        current = self.producers.get(name)
        if (current is not None and current.stop_at is None and current.alive()
                and (current.handle is not None or probe(name, self.share_dir) is not None)):
            return  # an adopted one is asked, not just looked up by pid (pids get reused)
        if current is not None and current.stop_at is None:
            self.producers.pop(name)  # died: start it again below
            log.warning("producer %r (pid %d) is gone; starting it again", name, current.pid)
        if current is not None and current.stop_at is not None:
            self._kill(current)  # being stopped, but a job wants it again: a fresh one
        logfile = self.log_path(name)
        if factory is None:
            raise ProducerStartError(f"no factory is known for dataset {name!r}",
                                     hint="submit the job again with --dataset-factory module:factory")
        try:
            self.share_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            pspec = ProducerSpec(factory, name, state_dir=str(self.share_dir))
            handle = start_producer(pspec, log_path=logfile, cwd=spec.cwd, env=dict(spec.env))
        except ProducerExistsError:
            status = probe(name, self.share_dir)
            if status is not None:  # someone else started it under our share dir: use it
                self.producers[name] = _Producer(name, None, status.pid)
                return
            raise ProducerStartError(f"producer {name!r} vanished while starting; see {logfile}") from None
        except (OSError, CollocateError) as exc:
            raise ProducerStartError(f"could not start producer {name!r}: {_first_line(exc)}; "
                                     f"its log: {logfile}") from None
        producer = _Producer(name, factory, handle.pid, handle)
        self.producers[name] = producer
        log.info("started producer %r (pid %d, %s)", name, handle.pid, factory)
        try:
            handle.wait_ready(timeout=self.ready_timeout_s)
        except ShareError as exc:
            self._kill(producer)
            self.producers.pop(name, None)
            raise ProducerStartError(f"producer for dataset {name!r} failed to start: {_first_line(exc)}; "
                                     f"its log: {logfile}") from None

    def reconcile(self, wanted: Iterable[str], now: float | None = None) -> None:
        """Stop producers no pending or running job needs; reap those stopping (never blocks)."""
        now = time.monotonic() if now is None else now
        wanted = set(wanted)
        for name, p in list(self.producers.items()):
            if p.stop_at is None and name not in wanted:
                log.info("stopping producer %r (pid %d): no job of it is left", name, p.pid)
                p.stop_at = now
                self._signal(p, signal.SIGTERM)
            if p.stop_at is None:
                continue
            if not p.alive():
                self.producers.pop(name, None)
                log.info("producer %r (pid %d) stopped", name, p.pid)
            elif now - p.stop_at > STOP_GRACE_S:
                self._signal(p, signal.SIGKILL)

    def close(self) -> None:
        """Daemon stop: producers keep serving running jobs; the next daemon re-adopts them.
        Only reap children already told to stop, so none is left a zombie needlessly."""
        for p in self.producers.values():
            if p.stop_at is not None and p.handle is not None:
                p.alive()

    def _kill(self, p: _Producer) -> None:
        self._signal(p, signal.SIGKILL)
        if p.handle is not None:
            try:
                p.handle.process.wait(2.0)  # type: ignore[attr-defined]
            except Exception:
                log.warning("producer %r (pid %d) did not die", p.name, p.pid)

    @staticmethod
    def _signal(p: _Producer, sig: int) -> None:
        """SIGTERM the producer alone (it shuts down its own loader workers); SIGKILL its whole
        process group (``start_producer`` gives it a session of its own)."""
        try:
            if sig == signal.SIGKILL:
                os.killpg(p.pid, sig)
            else:
                os.kill(p.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _first_line(exc: BaseException) -> str:
    """The message without a library hint meant for direct callers (the log path replaces it)."""
    return str(exc.args[0]) if exc.args else type(exc).__name__
