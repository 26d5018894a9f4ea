"""Measure the ground truth for the memory estimator on a real GPU.

For every configuration (model x batch size x optimizer x precision) a fresh Python process
builds the model through its entry point, moves it to the GPU and runs a few training
iterations; it then reports the process's GPU memory as NVML sees it (``nvidia-ml-py``, per
process, which includes the CUDA context) and PyTorch's ``max_memory_reserved`` /
``max_memory_allocated``. Separate processes keep one configuration's cached memory from
leaking into the next. torchvision, timm and transformers configurations are included when
those packages import (models are built from configs, no weights).

    python benchmarks/gpu/estimator_ground_truth.py                 # all configs, on the GPU
    python benchmarks/gpu/estimator_ground_truth.py --dry-run       # CPU: build + 1 step each
    python benchmarks/gpu/estimator_ground_truth.py --only mlp-b256-sgd-fp32 --dry-run

Writes ``benchmarks/results/estimator_ground_truth-<date>.csv`` (device, driver, CUDA and torch
versions and the date are columns of every row). A dry run measures nothing and writes no CSV
unless ``--out`` is given, in which case memory columns stay empty and status is "dry-run"; it
runs in fp32 (mixed precision is only exercised on the GPU).

The CSV is rewritten after every configuration, so a run stopped part-way keeps what it measured.
``--budget SECONDS`` starts no configuration that would likely end past the budget (the estimate
is the slowest configuration so far, at least 15 s) and prints what is left; ``--resume CSV``
keeps that file's finished rows (ok, oom) and runs only the others, writing old and new rows to
``--out`` (which may be the same file):

    python benchmarks/gpu/estimator_ground_truth.py --out gt.csv --budget 450
    python benchmarks/gpu/estimator_ground_truth.py --out gt.csv --budget 450 --resume gt.csv

Most of a configuration's time is its process starting (importing torch, creating the CUDA
context), not its training, so ``--jobs N`` measures N configurations at once, each still its
own process. Their memory stays apart: NVML reports each process's memory and PyTorch's peaks
are per process. What sharing could change is whether a configuration runs out of memory, so
with ``--jobs`` above 1 every ``oom`` is measured again alone before it is kept, and a process
NVML cannot see gets no device-wide fallback (the device's growth would include the others).
The ``jobs`` column records how many ran at once.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import importlib.util
import json
import os
import subprocess
import sys
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ITERATIONS = 3
CHILD_TIMEOUT_S = 600
MIN_CONFIG_S = 15.0  # the budget's first guess for one configuration (fresh process, CUDA init)
FINISHED = ("ok", "oom")  # statuses --resume keeps; the others are tried again

FIELDS = [
    "config", "family", "entry_point", "batch_size", "optimizer", "precision", "allocator", "status",
    "nvml_peak_mib", "nvml_source", "max_reserved_mib", "max_allocated_mib", "context_mib",
    # the caching allocator's side of reserved - allocated (where the estimator misses most)
    "large_pool_reserved_mib", "small_pool_reserved_mib", "inactive_split_peak_mib",
    "segments_peak", "alloc_retries",
    "iterations", "jobs",
    "device_name", "driver", "cuda", "torch", "date_utc", "error",
]


@dataclass(frozen=True)
class Config:
    name: str
    family: str  # mlp, cnn, transformer, recsys
    entry_point: str
    batch_size: int
    optimizer: str
    precision: str
    requires: str | None = None  # optional package the model needs


def _c(family: str, entry: str, bs: int, opt: str, prec: str, requires: str | None = None,
       short: str | None = None) -> Config:
    base = short or entry.split(":")[1].removeprefix("build_")
    return Config(f"{base}-b{bs}-{opt}-{prec}", family, entry, bs, opt, prec, requires)


M = "collocate.workloads.models:"
A = "collocate.workloads.adapters:"

CONFIGS: list[Config] = [
    # built-in MLPs
    _c("mlp", M + "build_mlp", 256, "sgd", "fp32"),
    _c("mlp", M + "build_mlp", 4096, "sgd", "fp32"),
    _c("mlp", M + "build_mlp", 4096, "adamw", "bf16"),
    # built-in CNNs
    _c("cnn", M + "build_resnet18_cifar", 128, "sgd", "fp32"),
    _c("cnn", M + "build_resnet18_cifar", 512, "adamw", "fp16"),
    _c("cnn", M + "build_resnet50_cifar", 256, "sgd", "fp32"),
    _c("cnn", M + "build_resnet18", 64, "sgd", "fp32"),
    _c("cnn", M + "build_resnet26", 64, "adam", "fp32"),
    _c("cnn", M + "build_resnet50", 32, "sgd", "fp32"),
    _c("cnn", M + "build_resnet50", 64, "sgd", "fp32"),
    _c("cnn", M + "build_resnet50", 128, "sgd", "fp32"),
    _c("cnn", M + "build_resnet50", 64, "adamw", "fp16"),
    _c("cnn", M + "build_resnet50", 128, "adamw", "bf16"),
    _c("cnn", M + "build_resnet152", 32, "sgd", "fp32"),
    _c("cnn", M + "build_resnet152", 64, "adamw", "bf16"),
    # built-in transformers (SDPA) and a recommender
    _c("transformer", M + "build_transformer_small", 16, "adamw", "fp32"),
    _c("transformer", M + "build_transformer_small", 32, "adamw", "bf16"),
    _c("transformer", M + "build_transformer_base", 8, "adamw", "fp32"),
    _c("transformer", M + "build_transformer_base", 16, "adamw", "bf16"),
    _c("transformer", M + "build_transformer_base", 16, "sgd", "fp16"),
    _c("transformer", M + "build_transformer_base_ckpt", 32, "adamw", "bf16"),
    _c("recsys", M + "build_dlrm", 2048, "adam", "fp32"),
    _c("recsys", M + "build_dlrm", 8192, "adam", "fp32"),
    # torchvision
    *[_c("cnn", A + f"tv_{m}", bs, opt, prec, "torchvision")
      for m, bs, opt, prec in [
          ("resnet50", 64, "sgd", "fp32"), ("resnet50", 128, "sgd", "fp16"),
          ("vgg16", 32, "sgd", "fp32"), ("vgg16", 64, "sgd", "bf16"),
          ("mobilenet_v2", 128, "sgd", "fp32"), ("efficientnet_b0", 64, "adamw", "fp32"),
          ("densenet121", 64, "sgd", "fp32"), ("inception_v3", 32, "sgd", "fp32"),
          ("convnext_tiny", 64, "adamw", "bf16"), ("vit_b_16", 32, "adamw", "bf16"),
          ("vit_b_16", 64, "adamw", "fp32"), ("swin_t", 32, "adamw", "fp32"),
      ]],
    # timm
    *[_c("cnn" if not m.startswith("vit") else "transformer", A + f"timm_{m}", bs, opt, prec,
         "timm")
      for m, bs, opt, prec in [
          ("resnet50", 64, "sgd", "fp32"), ("efficientnet_b3", 32, "adamw", "fp32"),
          ("convnext_small", 32, "adamw", "bf16"), ("vit_base_patch16_224", 32, "adamw", "fp32"),
          ("vit_small_patch16_224", 128, "adamw", "bf16"),
      ]],
    # Hugging Face transformers
    *[_c("transformer", A + f"hf_{m}", bs, opt, prec, "transformers")
      for m, bs, opt, prec in [
          ("bert_base", 16, "adamw", "fp32"), ("bert_base", 32, "adamw", "bf16"),
          ("bert_large", 8, "adamw", "fp32"), ("gpt2", 8, "adamw", "fp32"),
          ("gpt2", 16, "adamw", "bf16"), ("gpt2_medium", 4, "adamw", "fp32"),
          ("roberta_base", 16, "adamw", "fp16"), ("t5_small", 16, "adamw", "fp32"),
      ]],
]


def available(cfg: Config) -> bool:
    return cfg.requires is None or importlib.util.find_spec(cfg.requires) is not None


# ------------------------------------------------------------------ child side


def _nvml_handle(pynvml: Any) -> Any:
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip()
    if first.startswith("GPU-") or first.startswith("MIG-"):
        return pynvml.nvmlDeviceGetHandleByUUID(first)
    return pynvml.nvmlDeviceGetHandleByIndex(int(first or 0))


def _nvml_used_mib(pid: int | None) -> float | None:
    """This process's GPU memory (pid given) or the whole device's used memory (pid None)."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:
        return None
    try:
        handle = _nvml_handle(pynvml)
        if pid is None:
            return pynvml.nvmlDeviceGetMemoryInfo(handle).used / 2**20
        for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if p.pid == pid and p.usedGpuMemory is not None:
                return p.usedGpuMemory / 2**20
        return None  # e.g. a container's PID namespace hides our pid from NVML
    finally:
        pynvml.nvmlShutdown()


def _device_info(torch: Any) -> dict[str, str]:
    info = {"device_name": "cpu", "driver": "", "cuda": str(torch.version.cuda or ""),
            "torch": torch.__version__}
    if torch.cuda.is_available():
        info["device_name"] = torch.cuda.get_device_name(0)
        try:
            import pynvml

            pynvml.nvmlInit()
            drv = pynvml.nvmlSystemGetDriverVersion()
            info["driver"] = drv.decode() if isinstance(drv, bytes) else str(drv)
            pynvml.nvmlShutdown()
        except Exception:
            pass
    return info


def allocator_stats(stats: dict[str, Any]) -> dict[str, Any]:
    """The caching allocator's peaks from ``torch.cuda.memory_stats()``: how the reserved memory
    splits into large and small pools, the most memory held in split blocks no tensor uses
    (fragmentation), the most segments, and how often an allocation had to free the cache."""
    def mib(key: str) -> float | None:
        return round(stats[key] / 2**20, 1) if key in stats else None

    return {"large_pool_reserved_mib": mib("reserved_bytes.large_pool.peak"),
            "small_pool_reserved_mib": mib("reserved_bytes.small_pool.peak"),
            "inactive_split_peak_mib": mib("inactive_split_bytes.all.peak"),
            "segments_peak": stats.get("segment.all.peak"),
            "alloc_retries": stats.get("num_alloc_retries")}


def run_child(cfg: Config, dry_run: bool, shared: bool = False) -> dict[str, Any]:
    """Build and train one configuration in this process; return one CSV row.

    ``shared``: other configurations run on the GPU at the same time, so the device's used
    memory says nothing about this process."""
    device_used_before = None if dry_run else _nvml_used_mib(None)  # before CUDA starts
    import torch

    from collocate.estimate.entrypoint import load
    from collocate.estimate.gpu_overheads import allocator_from_conf
    from collocate.estimate.trace import as_args, default_loss, prefer_foreach

    row: dict[str, Any] = {**_device_info(torch), "iterations": 0,
                           "allocator": allocator_from_conf(os.environ.get("PYTORCH_CUDA_ALLOC_CONF"))}
    device = "cpu" if dry_run else "cuda"
    bs = 2 if dry_run else cfg.batch_size
    work = load(cfg.entry_point, bs, cfg.optimizer)
    if dry_run:
        row["status"] = "dry-run"
    work.model.to(device)
    # The optimizer was built on CPU parameters; rebuild it for the moved ones.
    from collocate.estimate.entrypoint import make_optimizer

    work.optimizer = make_optimizer(cfg.optimizer, work.model.parameters())
    if not dry_run:
        prefer_foreach(work.optimizer)

    def move(t: Any) -> Any:
        return t.to(device) if isinstance(t, torch.Tensor) else t

    inputs = ({k: move(v) for k, v in work.inputs.items()} if isinstance(work.inputs, dict)
              else tuple(move(t) for t in work.inputs) if isinstance(work.inputs, tuple | list)
              else move(work.inputs))
    targets = move(work.targets)
    # A dry run stays in fp32: CPUs without native bf16/fp16 matmuls emulate them, which turns a
    # one-step smoke test into minutes. The GPU run uses the configured precision.
    amp = None if dry_run else {"fp16": torch.float16, "bf16": torch.bfloat16}.get(cfg.precision)
    scaler = torch.amp.GradScaler("cuda", enabled=cfg.precision == "fp16" and not dry_run)
    args, kwargs = as_args(inputs)
    work.model.train()
    nvml_peak = device_peak = 0.0
    for _ in range(1 if dry_run else ITERATIONS):
        work.optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device, dtype=amp or torch.float32, enabled=amp is not None):
            out = work.model(*args, **kwargs)
            if work.loss_fn is None:
                loss = default_loss(out, targets)
            else:
                loss = work.loss_fn(out, targets) if targets is not None else work.loss_fn(out)
        scaler.scale(loss).backward()
        scaler.step(work.optimizer)
        scaler.update()
        row["iterations"] += 1
        if not dry_run:
            torch.cuda.synchronize()
            nvml_peak = max(nvml_peak, _nvml_used_mib(os.getpid()) or 0.0)
            device_peak = max(device_peak, _nvml_used_mib(None) or 0.0)
    if not dry_run:
        row["max_reserved_mib"] = round(torch.cuda.max_memory_reserved() / 2**20, 1)
        row["max_allocated_mib"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
        row.update(allocator_stats(torch.cuda.memory_stats()))
        if not nvml_peak and device_used_before is not None and device_peak and not shared:
            # NVML could not see our pid: fall back to the device's growth (valid when the GPU
            # runs nothing else, which the measurement requires anyway).
            nvml_peak = device_peak - device_used_before
            row["nvml_source"] = "device-delta"
        elif nvml_peak:
            row["nvml_source"] = "process"
        if nvml_peak:
            row["nvml_peak_mib"] = round(nvml_peak, 1)
            row["context_mib"] = round(nvml_peak - row["max_reserved_mib"], 1)
        row["status"] = "ok"
    return row


# ------------------------------------------------------------------ parent side


def measure(cfg: Config, dry_run: bool, timeout_s: float = CHILD_TIMEOUT_S,
            jobs: int = 1) -> dict[str, Any]:
    """Run one configuration in a fresh subprocess (``jobs`` of them at once) and return its
    CSV row."""
    base = {k: v for k, v in asdict(cfg).items() if k != "requires"}
    base["config"] = base.pop("name")
    base["jobs"] = jobs
    argv = [sys.executable, __file__, "--child", json.dumps(asdict(cfg))]
    if dry_run:
        argv.append("--dry-run")
    if jobs > 1:
        argv.append("--shared")
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s,
                              check=False)
    except subprocess.TimeoutExpired:
        return {**base, "status": "timeout", "error": f"over {timeout_s:g} s"}
    lines = proc.stdout.strip().splitlines()
    if proc.returncode == 0 and lines:
        return {**base, **json.loads(lines[-1])}
    err = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    status = "oom" if "out of memory" in proc.stderr.lower() else "error"
    return {**base, "status": status, "error": err[:300]}


def read_csv(path: Path) -> list[dict[str, Any]]:
    """Rows of an earlier CSV of this script (empty when the file does not exist)."""
    if not path.exists():
        return []
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    """All rows so far, written to a temporary file and moved in place (never half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    os.replace(tmp, path)


def _report(cfg: Config, row: dict[str, Any], took: float, note: str = "") -> None:
    print(f"{cfg.name:45s} {row['status']:8s} nvml={row.get('nvml_peak_mib', '')} "
          f"reserved={row.get('max_reserved_mib', '')} [{took:.1f} s]{note} "
          f"{row.get('error', '')}", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Measure GPU memory ground truth for the estimator.")
    ap.add_argument("--dry-run", action="store_true", help="CPU only: build and step each model")
    ap.add_argument("--only", nargs="*", help="config names to run (default: all)")
    ap.add_argument("--list", action="store_true", help="print the configurations and exit")
    ap.add_argument("--out", type=Path, help="CSV path (default: benchmarks/results/...)")
    ap.add_argument("--budget", type=float, help="start no configuration past this many seconds")
    ap.add_argument("--resume", type=Path, help="keep this CSV's finished rows, run the rest")
    ap.add_argument("--jobs", type=int, default=1,
                    help="configurations measured at once, each its own process (an oom is "
                         "measured again alone); default 1")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--shared", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.child:
        row = run_child(Config(**json.loads(args.child)), args.dry_run, args.shared)
        print(json.dumps(row))
        return 0
    if args.jobs < 1:
        raise SystemExit("--jobs must be at least 1")

    names = [c.name for c in CONFIGS]
    if len(set(names)) != len(names):
        raise SystemExit("duplicate configuration names")
    if args.list:
        for c in CONFIGS:
            print(f"{c.name:45s} {c.entry_point} {'(needs ' + c.requires + ')' if c.requires else ''}")
        return 0
    chosen = [c for c in CONFIGS if not args.only or c.name in args.only]
    if args.only and len(chosen) != len(args.only):
        unknown = sorted(set(args.only) - set(names))
        raise SystemExit(f"unknown config(s): {', '.join(unknown)}; see --list")
    if not args.dry_run:
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("no CUDA GPU visible: run on the GPU machine, or use --dry-run")
    begin = time.monotonic()
    date = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    out = args.out
    if out is None and not args.dry_run:
        out = Path(__file__).parents[1] / "results" / f"estimator_ground_truth-{date[:10]}.csv"
    finished = FINISHED + (("dry-run",) if args.dry_run else ())
    kept = [r for r in read_csv(args.resume) if r.get("status") in finished] if args.resume else []
    if kept:
        print(f"resume: {len(kept)} finished configuration(s) kept from {args.resume}")
    done = {r["config"] for r in kept}
    todo = []
    for cfg in chosen:
        if cfg.name in done:
            continue
        if available(cfg):
            todo.append(cfg)
        else:
            print(f"skip {cfg.name}: {cfg.requires} not installed")
    new: dict[str, dict[str, Any]] = {}
    order = {c.name: k for k, c in enumerate(CONFIGS)}

    def save() -> None:
        if out is not None:
            rows = kept + sorted(new.values(), key=lambda r: order[r["config"]])
            write_csv(out, rows)

    slowest = MIN_CONFIG_S

    def within_budget() -> bool:
        return args.budget is None or time.monotonic() - begin + slowest <= args.budget

    def timeout() -> float:
        if args.budget is None:
            return CHILD_TIMEOUT_S
        return max(30.0, min(CHILD_TIMEOUT_S, args.budget - (time.monotonic() - begin) + 60.0))

    def timed(cfg: Config, jobs: int) -> tuple[dict[str, Any], float]:
        t0 = time.monotonic()
        row = measure(cfg, args.dry_run, timeout(), jobs)
        return row, time.monotonic() - t0

    queue = list(todo)
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        running: dict[Future, Config] = {}
        while queue or running:
            while queue and len(running) < args.jobs and within_budget():
                cfg = queue.pop(0)
                running[pool.submit(timed, cfg, args.jobs)] = cfg
            if not running:
                break
            finished_now, _ = wait(running, return_when=FIRST_COMPLETED)
            for fut in finished_now:
                cfg = running.pop(fut)
                row, took = fut.result()
                slowest = max(slowest, took)
                row["date_utc"] = date
                new[cfg.name] = row
                _report(cfg, row, took)
                save()
    # Out of memory beside other configurations is not out of memory alone: measure it again
    # alone, and keep that.
    again = [c for c in todo if c.name in new and new[c.name]["status"] == "oom" and args.jobs > 1]
    for k, cfg in enumerate(again):
        if not within_budget():
            queue = again[k:] + queue
            break
        row, took = timed(cfg, 1)
        slowest = max(slowest, took)
        row["date_utc"] = date
        new[cfg.name] = row
        _report(cfg, row, took, " (again, alone)")
        save()
    if queue:
        left = [c.name for c in queue]
        print(f"budget of {args.budget:g} s reached: {len(left)} configuration(s) left; "
              f"run again with --resume: {' '.join(left)}")
        for cfg in queue:  # an oom kept from a shared run would not be a result: drop it
            if new.get(cfg.name, {}).get("status") == "oom":
                del new[cfg.name]
    save()
    rows = kept + list(new.values())
    if out is not None:
        print(f"wrote {len(rows)} rows to {out}")
    bad = [r for r in rows if r["status"] not in ("ok", "dry-run", "oom")]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
