"""One benchmark training process: ``python -m collocate.bench.worker --workload NAME ...``.

Why a separate program: collocation happens between processes (each has its own CUDA context,
which is what time-slicing and MPS share), so every job of a scenario must be a real process.

It trains one built-in workload on synthetic data (the batch stays on the device: no input
pipeline), warms up, then measures either for ``--seconds`` (throughput scenarios) or for
``--steps`` (fixed work, for the mini-trace: a job collocated with others then takes longer, as
real jobs do). With ``--ready-file``/``--go-file`` the runner aligns the measurement windows of
all processes of a scenario: each signals readiness after warm-up and *keeps training* until the
go signal, and with ``--stop-file`` keeps training after its measurement until every process is
done, so no window is measured on a GPU that others have already left.

The JSON written to ``--out`` holds samples/s, step-time percentiles, torch's peak memory, the
pid and the measurement window (epoch seconds, to align with GPU samples). Exit status: 0 ok,
1 out of memory ("CUDA out of memory" on stderr, as the daemon's OOM recovery expects),
2 bad arguments or no GPU, 3 other failures (the traceback is in the JSON and on stderr).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from collocate.bench.workloads import WORKLOADS, workload

EXIT_OK, EXIT_OOM, EXIT_USAGE, EXIT_FAILED = 0, 1, 2, 3
NO_GPU_HINT = "no CUDA GPU is visible to PyTorch; use --device cpu (tiny models, not GPU numbers)"


def _process_start() -> float:
    """When this process started (so start-up cost includes the interpreter and imports)."""
    try:
        import psutil

        return float(psutil.Process().create_time())
    except Exception:
        return time.time()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m collocate.bench.worker",
                                description="Train one built-in workload on synthetic data.")
    p.add_argument("--workload", required=True, choices=sorted(WORKLOADS))
    work = p.add_mutually_exclusive_group()
    work.add_argument("--seconds", type=float, help="measure for this long (default 10)")
    work.add_argument("--steps", type=int, help="fixed work: this many steps after warm-up")
    p.add_argument("--warmup", type=float, default=None,
                   help="warm-up seconds (default 5 on cuda, 0.5 on cpu; 0 with --steps)")
    p.add_argument("--warmup-steps", type=int, default=None, help="at least this many (default 3)")
    p.add_argument("--batch-size", type=int, default=None, help="default: the workload's")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--size", choices=("full", "tiny"), default=None,
                   help="model size (default: full on cuda, tiny on cpu)")
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (cpu runs)")
    p.add_argument("--out", type=Path, help="JSON result file")
    p.add_argument("--ready-file", type=Path, help="touched after warm-up")
    p.add_argument("--go-file", type=Path, help="keep warming until it exists, then measure")
    p.add_argument("--stop-file", type=Path, help="keep training after measuring until it exists")
    p.add_argument("--wait-timeout", type=float, default=600.0,
                   help="give up waiting for --go-file/--stop-file after this many seconds")
    args = p.parse_args(argv)
    if args.seconds is None and args.steps is None:
        args.seconds = 10.0
    for name in ("seconds", "steps", "batch_size", "warmup", "warmup_steps"):
        value = getattr(args, name)
        if value is not None and value < (1 if name in ("steps", "batch_size") else 0):
            p.error(f"--{name.replace('_', '-')} must be positive, got {value}")
    if args.size is None:
        args.size = "full" if args.device == "cuda" else "tiny"
    if args.warmup is None:
        args.warmup = 0.0 if args.steps else (5.0 if args.device == "cuda" else 0.5)
    if args.warmup_steps is None:
        args.warmup_steps = 0 if args.steps and args.warmup == 0 else 3
    return args


def _to(obj: Any, device: Any) -> Any:
    if isinstance(obj, tuple | list):
        return type(obj)(_to(o, device) for o in obj)
    return obj.to(device)


def _loss(out: Any, targets: Any, loss_fn: Any) -> Any:
    import torch.nn.functional as F

    if loss_fn is not None:
        return loss_fn(out, targets)
    if targets.is_floating_point():
        return F.mse_loss(out.float(), targets)
    return F.cross_entropy(out.reshape(-1, out.shape[-1]).float(), targets.reshape(-1))


class Trainer:
    """The model, its batch and one timed training step (synchronised through ``loss.item()``)."""

    def __init__(self, args: argparse.Namespace, device: Any) -> None:
        import torch

        spec = workload(args.workload)
        self.batch_size = args.batch_size or (
            spec.batch_size if args.size == "full" else spec.tiny_batch_size)
        built = spec.build(self.batch_size, tiny=args.size == "tiny")
        self.model = built[0].to(device).train()
        inputs, self.targets = _to(built[1], device)
        self.inputs = inputs if isinstance(inputs, tuple | list) else (inputs,)
        self.optimizer = built[2]
        self.loss_fn = built[3] if len(built) > 3 else None
        self.autocast = (torch.autocast(device.type, dtype=torch.bfloat16)
                         if args.precision == "bf16" else None)

    def step(self) -> float:
        start = time.perf_counter()
        self.optimizer.zero_grad(set_to_none=True)
        if self.autocast is not None:
            with self.autocast:
                loss = _loss(self.model(*self.inputs), self.targets, self.loss_fn)
        else:
            loss = _loss(self.model(*self.inputs), self.targets, self.loss_fn)
        loss.backward()
        self.optimizer.step()
        loss.item()  # waits for the GPU: the step is really done
        return time.perf_counter() - start


def _percentiles(times: list[float]) -> dict[str, float | None]:
    import numpy as np

    if not times:
        return {"mean": None, "p50": None, "p90": None, "p99": None}
    ms = np.asarray(times) * 1000.0
    return {"mean": float(ms.mean()), "p50": float(np.percentile(ms, 50)),
            "p90": float(np.percentile(ms, 90)), "p99": float(np.percentile(ms, 99))}


def _write_json(path: Path | None, doc: dict[str, Any]) -> None:
    if path is None:
        print(json.dumps(doc, indent=1))
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, path)


def _train_until(trainer: Trainer, flag: Path | None, timeout: float, what: str) -> int:
    """Keep training (so the GPU stays contended) until ``flag`` exists; steps taken."""
    if flag is None:
        return 0
    steps, deadline = 0, time.monotonic() + timeout
    while not flag.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout:g} s for {what} ({flag})")
        trainer.step()
        steps += 1
    return steps


def run(args: argparse.Namespace, started: float) -> dict[str, Any]:
    """Warm up, measure, return the result document (raises on failure)."""
    import torch

    if args.device == "cuda":
        if not torch.cuda.is_available():
            raise NoGpu(NO_GPU_HINT)
        device = torch.device("cuda")
        torch.backends.cudnn.benchmark = True
    else:
        device = torch.device("cpu")
        torch.set_num_threads(max(1, args.threads))
    torch.manual_seed(0)
    trainer = Trainer(args, device)
    spec = workload(args.workload)
    first_step_at = time.time()
    warm_steps, warm_start = 0, time.monotonic()
    while warm_steps < args.warmup_steps or time.monotonic() - warm_start < args.warmup:
        trainer.step()
        warm_steps += 1
    warmup_s = time.monotonic() - warm_start
    if args.ready_file is not None:
        args.ready_file.parent.mkdir(parents=True, exist_ok=True)
        args.ready_file.touch()
    waited_steps = _train_until(trainer, args.go_file, args.wait_timeout, "the go signal")
    times: list[float] = []
    measure_start = time.time()
    t0 = time.monotonic()
    while (len(times) < args.steps) if args.steps else (time.monotonic() - t0 < args.seconds):
        times.append(trainer.step())
    elapsed = time.monotonic() - t0
    measure_end = time.time()
    samples_per_s = len(times) * trainer.batch_size / elapsed if elapsed > 0 else None
    cuda = device.type == "cuda"
    mib = 1024.0 * 1024.0
    doc: dict[str, Any] = {
        "status": "ok",
        "workload": args.workload,
        "size": args.size,
        "device": device.type,
        "device_name": torch.cuda.get_device_name(device) if cuda else "cpu",
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "batch_size": trainer.batch_size,
        "precision": args.precision,
        "pid": os.getpid(),
        "mode": "steps" if args.steps else "seconds",
        "steps": len(times),
        "seconds": elapsed,
        "samples_per_s": samples_per_s,
        "steps_per_s": len(times) / elapsed if elapsed > 0 else None,
        "step_ms": _percentiles(times),
        "epoch_samples": spec.epoch_samples,
        "time_per_epoch_s": spec.epoch_samples / samples_per_s if samples_per_s else None,
        "max_memory_allocated_mib": torch.cuda.max_memory_allocated(device) / mib if cuda else None,
        "max_memory_reserved_mib": torch.cuda.max_memory_reserved(device) / mib if cuda else None,
        "startup_s": first_step_at - started,
        "warmup_steps": warm_steps,
        "warmup_s": warmup_s,
        "steps_while_waiting": waited_steps,
        "process_start": started,
        "measure_start": measure_start,
        "measure_end": measure_end,
        "env": _cuda_env(),
    }
    if not cuda:
        from collocate.bench.envinfo import CPU_NOTE

        doc["note"] = CPU_NOTE
    _write_json(args.out, doc)
    doc["steps_after"] = _train_until(trainer, args.stop_file, args.wait_timeout, "the stop signal")
    return doc


def _cuda_env() -> dict[str, str]:
    """The MPS/visibility settings this process ran with (directories only as "set")."""
    out = {}
    for k in sorted(os.environ):
        if k.startswith("CUDA_MPS_") or k == "CUDA_VISIBLE_DEVICES":
            out[k] = "set" if k.endswith("_DIRECTORY") else os.environ[k]
    return out


class NoGpu(Exception):
    """``--device cuda`` on a machine where PyTorch sees no GPU."""


def _is_oom(exc: BaseException) -> bool:
    text = f"{type(exc).__name__}: {exc}"
    return "OutOfMemoryError" in text or "out of memory" in text.lower()


def main(argv: list[str] | None = None) -> int:
    started = _process_start()
    args = parse_args(argv)
    base = {"workload": args.workload, "device": args.device, "pid": os.getpid()}
    try:
        run(args, started)
    except NoGpu as exc:
        print(f"error: {exc}", file=sys.stderr)
        _write_json(args.out, {**base, "status": "error", "error": str(exc)})
        return EXIT_USAGE
    except Exception as exc:
        oom = _is_oom(exc)
        detail = traceback.format_exc()
        print(detail, file=sys.stderr)
        if oom and "CUDA out of memory" not in detail:
            print("torch.OutOfMemoryError: CUDA out of memory", file=sys.stderr)
        if args.out is None or not args.out.exists():
            _write_json(args.out, {**base, "status": "oom" if oom else "failed",
                                   "error": f"{type(exc).__name__}: {exc}",
                                   "traceback": detail[-4000:]})
        return EXIT_OOM if oom else EXIT_FAILED
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
