"""An emulated training job: a real process that holds emulated GPU memory and slows down when
shared.

It behaves like a PyTorch training script as far as the daemon can tell, in the phases the
simulator plays too (``collocate.core.job_behaviour``, one definition for both, so the two can be
compared): a start-up (``startup_s``) with no GPU memory and no SM use; then a CUDA context and a
memory ramp in a few steps (``ramp_s``); first steps (``warmup_s``, counted from the end of
start-up) that hold memory but read almost no activity; then steady training at its solo SM and
DRAM activity. It finds its devices in ``CUDA_VISIBLE_DEVICES`` (emulated UUIDs), fails with
PyTorch's exact out-of-memory text and exit status 1 when a step does not fit, prints progress,
and dies cleanly on SIGTERM (exit 143). Its solo duration is ``seconds``, start-up and warm-up
included (they run at full speed, as on a GPU); while other jobs share its device its training
advances at ``progress_rate(slowdown)`` with the slowdown from ``collocate.core.interference``, so
collocated emulated jobs really take longer.

The memory a job really uses (``mem_mib``, then ``peak_mib`` from ``peak_at`` of its progress) is
independent of the requirement the scheduler was given at submit time: that is what lets a demo
show an under-estimated job crash and recover. With ``steps_per_s`` it reports its training steps
as a real loop's ``log_metric(..., step=)`` does, every ``STEP_REPORT_S``, slowed as it is.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from collocate.common.errors import CollocateError, InputError
from collocate.core.interference import InterferenceModel, default_interference
from collocate.core.job_behaviour import JobBehaviour, progress_rate
from collocate.core.model import JobProfile, SharingMode
from collocate.gpus.emulated_state import (
    Claim,
    DeviceRow,
    Refusal,
    StateStore,
    process_start_time,
)
from collocate.monitor.job_metrics import ENV_METRICS_FILE, log_metric
from collocate.node.fence import fence_of

ENV_SHARING = "COLLOCATE_SHARING"
EXIT_OOM = 1
STEP_REPORT_S = 0.25  # how often an emulated job that reports steps logs them
_MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class JobSpec:
    """What an emulated job does; validated in the constructor (bad values never start a job)."""

    mem_mib: float
    seconds: float
    sm: float = 0.5
    dram: float = 0.2
    ramp_s: float = 2.0
    peak_mib: float | None = None
    peak_at: float = 0.5  # fraction of progress at which the peak allocation happens
    tick_s: float | None = None  # None: seconds/40 within [0.02, 0.1] (short jobs stay precise)
    startup_s: float = 0.0  # no GPU memory, no activity
    warmup_s: float = 0.0  # after start-up: memory held, no activity yet
    steps_per_s: float = 0.0  # training steps a second alone, reported with log_metric (0: none)

    def __post_init__(self) -> None:
        checks = [
            (self.mem_mib >= 0, "--mem must be >= 0"),
            (self.seconds > 0, "--seconds must be > 0"),
            (0 <= self.sm <= 1, "--sm must be a fraction in [0, 1]"),
            (0 <= self.dram <= 1, "--dram must be a fraction in [0, 1]"),
            (self.ramp_s >= 0, "--ramp must be >= 0"),
            (self.peak_mib is None or self.peak_mib >= self.mem_mib, "--peak-mem must be >= --mem"),
            (0 <= self.peak_at <= 1, "--peak-at must be a fraction in [0, 1]"),
            (self.tick_s is None or self.tick_s > 0, "tick must be > 0"),
            (self.startup_s >= 0 and self.warmup_s >= 0, "--startup and --warmup must be >= 0"),
            (self.steps_per_s >= 0, "--steps-per-s must be >= 0"),
            (self.startup_s + self.warmup_s < self.seconds,
             "--startup and --warmup are part of --seconds: together they must be shorter"),
        ]
        for ok, message in checks:
            if not ok:
                raise InputError(message)

    @property
    def behaviour(self) -> JobBehaviour:
        """Its phases and memory over the run, as the simulator plays them."""
        return JobBehaviour(self.mem_mib, self.startup_s, self.ramp_s, self.warmup_s, self.peak_mib, self.peak_at)


class OutOfMemory(Exception):
    def __init__(self, refusal: Refusal, ordinal: int) -> None:
        super().__init__(oom_message(refusal, ordinal, os.getpid()))
        self.refusal = refusal


class Terminated(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.exit_code = 128 + signum


def torch_size(mib: float) -> str:
    """A size as PyTorch's caching allocator prints it (bytes/KiB/MiB/GiB, two decimals)."""
    size = int(round(mib * _MIB))
    if size <= 1024:
        return f"{size} bytes"
    if size <= _MIB:
        return f"{size / 1024:.2f} KiB"
    if size <= 1024 * _MIB:
        return f"{size / _MIB:.2f} MiB"
    return f"{size / (1024 * _MIB):.2f} GiB"


def oom_message(r: Refusal, ordinal: int, pid: int) -> str:
    """The line PyTorch prints for a failed CUDA allocation, with this claim's numbers."""
    others = "".join(f"Process {p} has {torch_size(m)} memory in use. " for p, m in r.others)
    return (
        "torch.OutOfMemoryError: CUDA out of memory."
        f" Tried to allocate {torch_size(r.requested_mib)}."
        f" GPU {ordinal} has a total capacity of {torch_size(r.total_mib)} of which"
        f" {torch_size(r.free_mib)} is free. {others}Including non-PyTorch memory, this process"
        f" has {torch_size(r.own_mib)} memory in use. Of the allocated memory"
        f" {torch_size(r.own_mib)} is allocated by PyTorch, and 0 bytes is reserved by PyTorch but"
        " unallocated. If reserved but unallocated memory is large try setting"
        " PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See"
        " documentation for Memory Management "
        " (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
    )


def resolve_devices(visible: str | None, devices: list[DeviceRow]) -> list[DeviceRow]:
    """Map ``CUDA_VISIBLE_DEVICES`` (emulated UUIDs, or indices into the device list) to devices."""
    if not visible or not visible.strip():
        raise CollocateError(
            "no CUDA devices visible: CUDA_VISIBLE_DEVICES is empty or unset",
            hint="run the job through the daemon, or set CUDA_VISIBLE_DEVICES=GPU-emu-<node>-0",
        )
    by_uuid = {d.uuid: d for d in devices}
    out: list[DeviceRow] = []
    for item in (v.strip() for v in visible.split(",")):
        if item in by_uuid:
            out.append(by_uuid[item])
        elif item.isdigit() and int(item) < len(devices):
            out.append(devices[int(item)])
        else:
            raise CollocateError(
                f"CUDA_VISIBLE_DEVICES names {item!r}, which is not an emulated device",
                hint=f"known devices: {', '.join(by_uuid) or 'none'}",
            )
    return out


def sharing_mode(env: dict[str, str] | os._Environ[str]) -> SharingMode:
    value = env.get(ENV_SHARING, SharingMode.TIME_SLICING.value)
    try:
        return SharingMode(value)
    except ValueError:
        raise InputError(
            f"{ENV_SHARING}={value!r} is not a sharing mode",
            hint=f"use one of {', '.join(m.value for m in SharingMode)}",
        ) from None


#: A gap between two ticks longer than this is the process being stopped (a cgroup freezer,
#: SIGSTOP): a stopped job makes no progress, so such a gap counts as one tick. A tick is at most
#: 0.1 s, and a process waiting for a CPU on a loaded machine is back within a few hundredths
#: (measured at load 6 on 2 cores: 0.02 s at worst); a frozen job is stopped for seconds. At
#: 2 s (before), a job thawed after a freeze of 2 s or more had gained 2 s of work while frozen.
FROZEN_GAP_S = 0.5


class EmulatedJob:
    """Runs one ``JobSpec`` against the emulated state; ``run`` returns the exit status."""

    def __init__(
        self, spec: JobSpec, store: StateStore, devices: list[DeviceRow], *,
        mode: SharingMode = SharingMode.TIME_SLICING, model: InterferenceModel | None = None,
        out: TextIO = sys.stdout, err: TextIO = sys.stderr,
        clock: Callable[[], float] = time.monotonic, metrics_file: str | None = None,
    ) -> None:
        """``metrics_file``: where its steps are reported (``$COLLOCATE_METRICS_FILE``, as a
        real job's ``log_metric`` writes them), when ``spec.steps_per_s`` asks for reports."""
        self.spec, self.store, self.devices, self.mode = spec, store, devices, mode
        self.metrics_file = metrics_file
        self.model = model or default_interference()
        self.out, self.err, self.clock = out, err, clock
        self.pid = os.getpid()
        started = process_start_time(self.pid)
        if started is None:
            raise CollocateError("cannot read this process's start time", hint="is /proc mounted?")
        self.started = started
        self.profile = JobProfile(spec.sm, spec.dram)
        self.limits: dict[int, float] = {}  # MPS pinned memory limit per visible ordinal (MiB)
        self.held: float | None = None  # None until the first claim (even of 0 MiB) is stored
        self.training = False  # whether the stored claim carries the job's activity
        self.reported = 1.0  # the slowdown whose rate the claims carry (new claims: rate 1)

    def run(self) -> int:
        """Run to completion; claims are released on every way out (done, OOM, signal, error)."""
        previous = {s: signal.signal(s, _raise_terminated) for s in (signal.SIGTERM, signal.SIGINT)}
        status = EXIT_OOM  # replaced on every path that returns
        message: tuple[str, TextIO] | None = None
        try:
            status = self._run()
        except OutOfMemory as exc:
            status, message = EXIT_OOM, (str(exc), self.err)
        except Terminated as exc:
            status, message = exc.exit_code, (f"terminated by {exc}; released GPU memory", self.out)
        finally:
            for s in previous:  # a second signal must not interrupt the release
                signal.signal(s, signal.SIG_IGN)
            self.store.release(self.pid)
            for s, handler in previous.items():
                signal.signal(s, handler)
        if message is not None:
            print(message[0], file=message[1], flush=True)
        return status

    def _run(self) -> int:
        uuids = ",".join(d.uuid for d in self.devices)
        self._say(f"emulated job pid {self.pid} on {uuids} mode {self.mode.value}")
        t0 = last = self.clock()
        progress, next_report = 0.0, 0.1
        steps, next_step_report = 0.0, 0.0
        tick = self.spec.tick_s or min(0.1, max(0.02, self.spec.seconds / 40))
        behaviour = self.spec.behaviour
        while True:
            now = self.clock()
            training = behaviour.training(now - t0)
            target = behaviour.mem_at(now - t0, progress)
            if target is not None:
                self._hold(target, training)
            slowdown = self._slowdown() if training else 1.0
            rate = progress_rate(slowdown)
            if self.held is not None and abs(slowdown - self.reported) > 0.01 * self.reported:
                self.store.set_rate(self.pid, rate)
                self.reported = slowdown
            # a gap this long is the process being stopped (frozen): no progress, as a real job
            dt = now - last if now - last <= FROZEN_GAP_S else tick
            progress += dt * rate / self.spec.seconds
            if training and self.spec.steps_per_s and self.metrics_file:
                steps += dt * self.spec.steps_per_s * rate
                if now >= next_step_report:  # as a training loop logs every few steps
                    log_metric("steps", steps, step=int(steps), path=self.metrics_file)
                    next_step_report = now + STEP_REPORT_S
            last = now
            if progress >= next_report or progress >= 1.0:
                shown = min(1.0, progress)
                self._say(f"progress {shown * 100:5.1f}% elapsed {now - t0:.2f}s "
                          f"slowdown {slowdown:.3f} mem {self.held or 0:.0f}MiB")
                next_report = shown + 0.1
            if progress >= 1.0:
                self._say(f"done in {now - t0:.2f}s (solo {self.spec.seconds:.2f}s)")
                return 0
            time.sleep(tick)

    def _hold(self, mib: float, training: bool = True) -> None:
        """Claim ``mib``; the claim carries the job's activity only once it trains."""
        if mib == self.held and training == self.training:
            return
        for ordinal, device in enumerate(self.devices):
            limit = self.limits.get(ordinal)
            if limit is not None and mib > limit:  # MPS or a capped allocator refuses it
                held = self.held or 0.0
                raise OutOfMemory(Refusal(device.uuid, mib - held, limit, max(0.0, limit - held),
                                          held, ()), ordinal)
            refusal = self.store.claim(
                device.uuid, self.pid, self.started, mib,
                self.spec.sm if training else 0.0, self.spec.dram if training else 0.0,
            )
            if refusal is not None:
                raise OutOfMemory(refusal, ordinal)
        self.held, self.training = mib, training

    def _slowdown(self) -> float:
        claims = self.store.live_claims(uuids=[d.uuid for d in self.devices])
        worst = 1.0
        for device in self.devices:
            others = [_profile(c) for c in claims if c.uuid == device.uuid and c.pid != self.pid
                      and (c.sm > 0 or c.dram > 0)]  # a neighbour in its first steps slows nobody
            worst = max(worst, self.model.slowdown(self.mode, self.profile, others, speed=device.sm_fraction))
        return worst

    def _say(self, text: str) -> None:
        print(text, file=self.out, flush=True)


def run_job(spec: JobSpec, state_dir: Path, env: os._Environ[str] | dict[str, str]) -> int:
    """Entry point for the CLI: resolve devices and mode from ``env`` and run the job."""
    store = StateStore.open_existing(state_dir)
    devices = resolve_devices(env.get("CUDA_VISIBLE_DEVICES"), store.devices())
    job = EmulatedJob(spec, store, devices, mode=sharing_mode(env), metrics_file=env.get(ENV_METRICS_FILE))
    if job.mode is SharingMode.MPS:
        job.limits = pinned_limits(env.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"))
    fence = fence_of(env)  # the capped caching allocator of a fenced PyTorch job, emulated
    if fence is not None:
        job.limits = {i: min(fence, job.limits.get(i, fence)) for i in range(len(devices))}
    return job.run()


def pinned_limits(text: str | None) -> dict[int, float]:
    """``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` (``0=7578M,1=2G``) as MiB per device ordinal; what
    the MPS server enforces on a real GPU, the emulated job enforces on itself."""
    limits: dict[int, float] = {}
    for item in (text or "").split(","):
        device, _, size = item.strip().partition("=")
        if not device.isdigit() or not size:
            continue
        scale = {"M": 1.0, "G": 1024.0}.get(size[-1].upper())
        try:
            limits[int(device)] = float(size[:-1]) * scale if scale else float(size) / (1024 * 1024)
        except ValueError:
            continue
    return limits


def _profile(c: Claim) -> JobProfile:
    return JobProfile(c.sm, c.dram)


def _raise_terminated(signum: int, _frame: object) -> None:
    raise Terminated(signum)
