"""GPU validation and benchmark of collocate.share's CUDA IPC ring (run on a machine with a GPU).

The CUDA ring (collocate/share/cuda_ipc.py) was written without a GPU. This script is how a
session with one validates and measures it:

  1. correctness: a producer with device="cuda:0" serves id-stamped batches; K consumers check
     every sample's content on the GPU, in order, for several epochs (exact coverage), with
     different batch sizes, while the ring is reused many times over;
  2. throughput: the JPEG pipeline of share_cpu.py feeding K GPU consumers that run a small
     convolution per batch, for (a) K independent DataLoaders + H2D copies, (b) collocate.share
     with the CUDA IPC ring, (b') collocate.share with the CPU ring + H2D copies in consumers,
     (c) tensorsocket 0.0.5 (its CUDA IPC path).

    python benchmarks/gpu/share_gpu.py             # on a GPU machine; writes benchmarks/results/share_gpu-<date>.json
    python benchmarks/gpu/share_gpu.py --dry-run   # anywhere: same plumbing on CPU, tiny sizes, no results file

``--out PATH`` names the JSON file (also in a dry run); it is rewritten after the correctness check
and after every throughput run, so a run stopped part-way keeps what it measured.
``--budget SECONDS`` starts no throughput run that would likely end past the budget (the estimate
is the slowest run so far, at least warm-up + window + 15 s); the skipped ones are recorded as
``"skipped: budget"``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import share_cpu

CTX = mp.get_context("spawn")


# ---------------------------------------------------------------- correctness
class _Stamped:
    """Batch i of every epoch holds samples i*bs.. with x = id (float) repeated: checkable anywhere."""

    def __init__(self, n: int, bs: int, width: int) -> None:
        self.n, self.bs, self.width = n, bs, width

    def __len__(self) -> int:
        return (self.n + self.bs - 1) // self.bs

    def __iter__(self) -> Any:
        for lo in range(0, self.n, self.bs):
            ids = torch.arange(lo, min(lo + self.bs, self.n))
            yield {"x": ids.float().view(-1, 1).expand(-1, self.width).contiguous(), "id": ids}


def _check_producer(name: str, device: str, n: int, width: int) -> None:
    from collocate import share

    share.serve(_Stamped(n, 16, width), name, device=device, slots=4, samples_per_epoch=n)


def _check_consumer(name: str, device: str, batch_size: int, epochs: int, out: Any) -> None:
    from collocate import share

    try:
        loader = share.SharedLoader(name, batch_size, connect_timeout=120)
        for _ in range(epochs):
            ids: list[int] = []
            for batch in loader:
                x, i = batch["x"].to(device), batch["id"].to(device)
                assert x.device.type == torch.device(device).type, f"batch on {x.device}, wanted {device}"
                assert torch.equal(x[:, 0].long(), i) and torch.equal(x.min(1).values, x.max(1).values), \
                    "sample content does not match its id"
                ids += i.tolist()
            assert sorted(ids) == list(range(loader._samples_per_epoch or 0)), "epoch coverage is not exact"
        loader.close()
        out.put(("ok", batch_size))
    except BaseException as exc:
        out.put(("fail", f"batch_size={batch_size}: {exc!r}"))


def correctness(device: str, n: int, width: int, epochs: int) -> list[tuple[str, Any]]:
    name = f"gpu-check-{os.getpid()}"
    queue = CTX.Queue()
    procs = [CTX.Process(target=_check_producer, args=(name, device, n, width))]
    procs += [CTX.Process(target=_check_consumer, args=(name, device, bs, epochs, queue)) for bs in (16, 10, 37)]
    for p in procs:
        p.start()
    try:
        return [queue.get(timeout=300) for _ in range(3)]
    finally:
        for p in procs:
            p.terminate()
            p.join(10)


# ---------------------------------------------------------------- throughput
def _step(x: torch.Tensor, conv: torch.nn.Module) -> None:
    conv(x).sum().item()  # a small training-step stand-in that reads the whole batch on the device


def _gpu_consumer(kind: str, arg: Any, device: str, warmup: float, window: float, out: Any) -> None:
    torch.set_num_threads(1)
    conv = torch.nn.Conv2d(3, 8, 3).to(device)

    def batches() -> Any:
        if kind == "independent":
            source: Any = share_cpu.make_loader(arg)
        elif kind == "share":
            from collocate import share

            source = share.SharedLoader(arg, 32, connect_timeout=120)
        else:
            from tensorsocket import TensorConsumer

            source = TensorConsumer(port=arg[0], ack_port=arg[1], heart_ports=(arg[2], arg[3]), batch_size=32)
        for x, y in source:
            x = x.to(device, non_blocking=True)
            _step(x, conv)
            yield x, y

    class _Wrapped:
        def __iter__(self) -> Any:
            return batches()

    share_cpu._measure(lambda: _Wrapped(), warmup, window, out)


def _producer(kind: str, name_or_ports: Any, workers: int, device: str) -> None:
    torch.set_num_threads(1)
    if kind == "tensorsocket":
        share_cpu.run_ts_producer(workers, name_or_ports, "jpeg")
        return
    from collocate import share

    share.serve(share_cpu.make_loader(workers), name_or_ports, slots=8, device=device)


def throughput(mode: str, k: int, workers: int, device: str, warmup: float, window: float, seq: int) -> float:
    queue = CTX.Queue()
    procs: list[Any] = []
    if mode == "independent":
        procs += [CTX.Process(target=_gpu_consumer, args=("independent", max(1, workers // k), device, warmup,
                                                          window, queue)) for _ in range(k)]
    elif mode in ("share-cuda", "share-cpu-ring"):
        name = f"gpu-bench-{os.getpid()}-{seq}"
        ring_device = device if mode == "share-cuda" else "cpu"
        procs.append(CTX.Process(target=_producer, args=("share", name, workers, ring_device)))
        procs += [CTX.Process(target=_gpu_consumer, args=("share", name, device, warmup, window, queue))
                  for _ in range(k)]
    else:
        base = 24000 + (os.getpid() % 500) * 20 + seq * 4
        ports = (base, base + 1, base + 2, base + 3)
        procs.append(CTX.Process(target=_producer, args=("tensorsocket", ports, workers, device)))
        procs += [CTX.Process(target=_gpu_consumer, args=("tensorsocket", ports, device, warmup, window, queue))
                  for _ in range(k)]
    for p in procs:
        p.start()
    return share_cpu._gather(procs, queue, k, warmup + window + 240)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="CPU only, tiny sizes, no results file")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--consumers", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--warmup", type=float, default=5.0)
    ap.add_argument("--window", type=float, default=15.0)
    ap.add_argument("--skip-tensorsocket", action="store_true")
    ap.add_argument("--out", type=Path, help="JSON result file (default: benchmarks/results/"
                    "share_gpu-<date>.json on a GPU, none in a dry run)")
    ap.add_argument("--budget", type=float, help="start no throughput run past this many seconds")
    args = ap.parse_args()
    begin = time.monotonic()
    if args.dry_run:
        args.device, args.workers, args.consumers, args.warmup, args.window = "cpu", 2, [2], 1.0, 2.0
    elif not torch.cuda.is_available():
        sys.exit("no CUDA device: run with --dry-run here, or on a GPU machine")
    out = args.out
    if out is None and not args.dry_run:
        out = Path(__file__).resolve().parent.parent / "results" / f"share_gpu-{datetime.now(UTC):%Y-%m-%d}.json"
    info = share_cpu.machine()
    info["device"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() and not args.dry_run else "cpu"
    print(json.dumps(info), flush=True)
    result: dict[str, Any] = {"benchmark": "share_gpu", "date": datetime.now(UTC).isoformat(timespec="seconds"),
                              "machine": info, "dry_run": args.dry_run,
                              "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                              "correctness": None, "throughput": []}

    def save() -> None:
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            tmp = out.with_name(out.name + ".tmp")
            tmp.write_text(json.dumps(result, indent=2) + "\n")
            os.replace(tmp, out)

    checks = correctness(args.device, 200 if args.dry_run else 5000, 8 if args.dry_run else 3 * 64 * 64,
                         2 if args.dry_run else 5)
    result["correctness"] = checks
    save()
    print("correctness:", checks, flush=True)
    modes = ["independent", "share-cuda", "share-cpu-ring"] + ([] if args.skip_tensorsocket else ["tensorsocket"])
    if args.dry_run:
        modes = [m for m in modes if m not in ("share-cuda", "tensorsocket")]  # CUDA-only paths
    slowest = args.warmup + args.window + 15.0

    def timed(mode: str, k: int, seq: int) -> float:
        nonlocal slowest
        t0 = time.monotonic()
        try:
            return throughput(mode, k, args.workers, args.device, args.warmup, args.window, seq)
        finally:
            slowest = max(slowest, time.monotonic() - t0)

    def over_budget() -> bool:
        return args.budget is not None and time.monotonic() - begin + slowest > args.budget

    t1 = timed("independent", 1, 0)
    rows, seq = result["throughput"], 1
    for k in args.consumers:
        row: dict[str, Any] = {"K": k, "single_T1": t1}
        rows.append(row)
        for mode in modes:
            seq += 1
            if over_budget():
                row[mode] = None
                row[f"{mode}_error"] = "skipped: budget"
                print(f"K={k} {mode}: skipped (budget of {args.budget:g} s)", flush=True)
                continue
            try:
                row[mode] = timed(mode, k, seq)
            except Exception as exc:
                row[mode], row[f"{mode}_error"] = None, repr(exc)
            print(f"K={k} {mode}: {row[mode]}", flush=True)
            save()
    result["seconds"] = round(time.monotonic() - begin, 1)
    print(json.dumps(result, indent=2))
    save()
    if out is not None:
        print(f"wrote {out}")
    if any(status != "ok" for status, _ in checks):
        sys.exit(1)


if __name__ == "__main__":
    main()
