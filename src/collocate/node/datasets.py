"""Shared datasets: one producer per ``--dataset`` name, alive while any job of it is queued or runs.

Jobs submitted with ``--dataset NAME`` read their batches from a ``collocate.share`` producer
instead of each running its own DataLoader. The daemon owns that producer's life:

* at submit, the daemon's ``resolve_factory`` (``daemon/producers.py``) fills in the
  ``module:factory`` from earlier jobs of the same name and refuses a different one while the
  dataset is in use: two factories cannot share one name;
* at launch, ``ensure`` starts the producer (as the job's user, in the job's cwd and
  environment, so the factory imports as it would in the job; ``producer_launcher``) and
  returns at once; the loop asks ``ensure`` again each
  round until the first batch is ready (then the job starts, with ``COLLOCATE_DATASET`` and
  ``COLLOCATE_SHARE_DIR``, which ``SharedLoader`` reads) or the producer failed or ran out of
  ``ready_timeout_s``. Why never block: a factory may take many seconds to build its loader,
  and a loop waiting on it answers no client, places no other job and sees no cancel;
* every round, ``reconcile`` stops producers whose dataset has no pending or running job left.
  Stopping only sends SIGTERM; a later round reaps the process (SIGKILL after a grace period),
  so the loop never waits on a producer's shutdown.

Producers are found by (name, share dir) alone (``collocate.share.naming``), so across a daemon
restart ``adopt`` probes each known name: a live producer is kept (and stopped by pid later), a
dead one is simply started again when the next job of its dataset launches. A producer still
building its loader does not answer probes yet, so each start is also recorded in
``share/NAME.pid`` (pid and process start time): a restarted daemon re-adopts that one too,
rather than starting a second producer that would lose the race for the name.

Each node runs one, under its root, for the jobs placed there (``node/local.py``); the head's
loop reaches it through the ``Node`` API (``ensure_producer``, ...), whichever node that is.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import psutil

from collocate.common.errors import CollocateError
from collocate.node.isolate import CLEAN_ENV, bootstrap_argv, write_env_file
from collocate.node.launcher import process_matches

log = logging.getLogger("collocate.daemon")

ENV_DATASET = "COLLOCATE_DATASET"
ENV_SHARE_DIR = "COLLOCATE_SHARE_DIR"  # read by ``SharedLoader`` when no state_dir is given
READY_TIMEOUT_S = 30.0  # a job waits this long for its producer's first batch (the loop does not)
PROBE_TIMEOUT_S = 0.5  # one status probe; a live producer answers from its control thread at once
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
    ready_by: float | None = None  # while starting: the monotonic deadline for its first batch

    def alive(self) -> bool:
        if self.handle is not None:
            return self.handle.is_alive()  # type: ignore[attr-defined]
        try:  # adopted: not our child, so it may linger as a zombie until init reaps it
            return psutil.Process(self.pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False
        except psutil.Error:
            return True


@dataclass(frozen=True, slots=True)
class ProducerRequest:
    """What a node needs to start a dataset's producer for a job: the dataset's name and
    factory, and the job's user, cwd and environment (the factory imports as it would in the
    job)."""

    dataset: str
    factory: str | None
    cwd: str
    env: Mapping[str, str]
    uid: int = -1
    gid: int = -1


class Datasets:
    """The producers this daemon runs, keyed by dataset name (loop thread only)."""

    def __init__(self, root: Path, *, ready_timeout_s: float = READY_TIMEOUT_S) -> None:
        self.share_dir = root / "share"  # only hashed into socket names; logs live here too
        self.ready_timeout_s = ready_timeout_s
        self.producers: dict[str, _Producer] = {}

    def log_path(self, name: str) -> Path:
        return self.share_dir / f"{name}.log"

    def _record_path(self, name: str) -> Path:
        return self.share_dir / f"{name}.pid"

    def job_env(self, name: str) -> dict[str, str]:
        return {ENV_DATASET: name, ENV_SHARE_DIR: str(self.share_dir)}

    def adopt(self, names: Iterable[str]) -> None:
        """After a restart: keep the producers of these names that still answer, or that are
        still starting (found by the pid record of their start)."""
        from collocate.share.lifecycle import probe

        for name in sorted(set(names)):
            if name in self.producers:
                continue
            status = probe(name, self.share_dir, timeout=1.0)
            if status is not None:
                ready_by = None if status.ready else time.monotonic() + self.ready_timeout_s
                self.producers[name] = _Producer(name, None, status.pid, ready_by=ready_by)
                log.info("re-adopted producer %r (pid %d)", name, status.pid)
                continue
            record = _read_record(self._record_path(name))
            if record is not None and process_matches(*record):
                self.producers[name] = _Producer(name, None, record[0],
                                                 ready_by=time.monotonic() + self.ready_timeout_s)
                log.info("re-adopted producer %r (pid %d), still starting", name, record[0])

    def ensure(self, spec: ProducerRequest, now: float | None = None) -> bool:
        """True when ``spec``'s dataset is served; else start its producer if needed and return
        False (ask again next round). Never waits for the producer.

        Raises ``ProducerStartError`` (naming the log) when it cannot start, exits before its
        first batch, or is not ready within ``ready_timeout_s`` of its start; what is left of it
        is killed so the next launch starts clean.
        """
        from collocate.share.errors import ProducerExistsError
        from collocate.share.lifecycle import ProducerSpec, probe, start_producer

        name, factory = spec.dataset, spec.factory
        now = time.monotonic() if now is None else now
        current = self.producers.get(name)
        if current is not None and current.stop_at is None:
            if current.ready_by is not None:
                return self._check_starting(current, now)
            if current.alive() and (current.handle is not None
                                    or probe(name, self.share_dir, timeout=PROBE_TIMEOUT_S)):
                return True  # an adopted one is asked, not just looked up by pid (pids get reused)
            self._forget(current)  # died: start it again below
            log.warning("producer %r (pid %d) is gone; starting it again", name, current.pid)
        elif current is not None:
            self._kill(current)  # being stopped, but a job wants it again: a fresh one
            self._forget(current)
        logfile = self.log_path(name)
        if factory is None:
            raise ProducerStartError(f"no factory is known for dataset {name!r}",
                                     hint="submit the job again with --dataset-factory module:factory")
        try:
            self.share_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            pspec = ProducerSpec(factory, name, state_dir=str(self.share_dir))
            env_file = self.share_dir / f"{name}.env"
            write_env_file(env_file, spec.env)
            handle = start_producer(pspec, log_path=logfile, cwd=self.share_dir, env=dict(CLEAN_ENV),
                                    argv_prefix=producer_launcher(spec, env_file))
        except ProducerExistsError:
            status = probe(name, self.share_dir, timeout=PROBE_TIMEOUT_S)
            if status is None:
                raise ProducerStartError(f"producer {name!r} vanished while starting; see {logfile}") from None
            # someone else started it under our share dir: use it
            adopted = _Producer(name, None, status.pid,
                                ready_by=None if status.ready else now + self.ready_timeout_s)
            self.producers[name] = adopted
            return adopted.ready_by is None
        except (OSError, CollocateError) as exc:
            raise ProducerStartError(f"could not start producer {name!r}: {_first_line(exc)}; "
                                     f"its log: {logfile}") from None
        producer = _Producer(name, factory, handle.pid, handle, ready_by=now + self.ready_timeout_s)
        self.producers[name] = producer
        _write_record(self._record_path(name), handle.pid)
        log.info("started producer %r (pid %d, %s)", name, handle.pid, factory)
        return self._check_starting(producer, now)

    def _check_starting(self, p: _Producer, now: float) -> bool:
        """One look at a starting producer: ready (True), still starting (False), or raise."""
        from collocate.share.lifecycle import probe

        assert p.ready_by is not None
        why = None
        if not p.alive():
            code = getattr(getattr(p.handle, "process", None), "returncode", None)
            why = "it exited" + ("" if code is None else f" with code {code}") + " before it was ready"
        else:
            status = probe(p.name, self.share_dir, timeout=PROBE_TIMEOUT_S)
            if status is not None and status.pid == p.pid and status.ready:
                p.ready_by = None
                log.info("producer %r (pid %d) is ready", p.name, p.pid)
                return True
            if now > p.ready_by:
                why = f"it was not ready within {self.ready_timeout_s:g} s"
        if why is None:
            return False
        self._kill(p)
        self._forget(p)
        raise ProducerStartError(f"producer for dataset {p.name!r} failed to start: {why}; "
                                 f"its log: {self.log_path(p.name)}")

    def _forget(self, p: _Producer) -> None:
        if self.producers.get(p.name) is p:
            self.producers.pop(p.name)
        record = _read_record(self._record_path(p.name))
        if record is not None and record[0] == p.pid:
            self._record_path(p.name).unlink(missing_ok=True)

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
                self._forget(p)
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


def producer_launcher(spec: ProducerRequest, env_file: Path) -> tuple[str, ...]:
    """How a producer starts: like a job, as the job's user (a root daemon), in the job's cwd
    entered as that user, with the job's environment; the factory's module is imported only
    there, never in a process with the daemon's privileges."""
    as_other = os.geteuid() == 0 and spec.uid not in (-1, 0)
    as_user = ("--uid", str(spec.uid), "--gid", str(spec.gid)) if as_other else ()
    return (*bootstrap_argv("collocate.node.isolate"), *as_user, "--cwd", spec.cwd,
            "--env-file", str(env_file), "--")


def _write_record(path: Path, pid: int) -> None:
    """``share/NAME.pid``: the pid and process start time, so a restart can re-adopt a producer
    that does not answer probes yet (process start time guards against a reused pid)."""
    try:
        started = psutil.Process(pid).create_time()
        tmp = path.with_suffix(".pid.tmp")
        tmp.write_text(json.dumps({"pid": pid, "started": started}))
        os.replace(tmp, path)
    except (OSError, psutil.Error) as exc:
        log.warning("cannot record producer pid %d in %s: %s", pid, path, exc)


def _read_record(path: Path) -> tuple[int, float] | None:
    try:
        record = json.loads(path.read_text())
        return int(record["pid"]), float(record["started"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _first_line(exc: BaseException) -> str:
    """The message without a library hint meant for direct callers (the log path replaces it)."""
    return str(exc.args[0]) if exc.args else type(exc).__name__
