"""GPU validation and benchmark of collocate.share's CUDA IPC ring (run on a machine with a GPU).

The CUDA ring (collocate/share/cuda_ipc.py) was written without a GPU. This script is how a
session with one validates and measures it:

  1. correctness: a producer with device="cuda:0" serves id-stamped batches; K consumers check
     every sample's content on the GPU, in order, for several epochs (exact coverage), with
     different batch sizes, while the ring is reused many times over;
  2. throughput: the JPEG pipeline of share_cpu.py feeding K GPU consumers that run a small
     convolution per batch, for (a) K independent DataLoaders + H2D copies, (b) collocate.share
     with the CUDA IPC ring, (b') collocate.share with the CPU ring + H2D copies in consumers,
     (c) tensorsocket 0.0.5 (its CUDA IPC path); first, the reference T1: one consumer with one
     DataLoader of all the workers. Each measurement counts every consumer's samples over one
     common window (``--window`` s, starting ``--warmup`` s after the last consumer's first batch;
     benchmarks/_share_measure.py, shared with share_cpu.py).

    python benchmarks/gpu/share_gpu.py             # on a GPU machine; writes benchmarks/results/share_gpu-<date>.json
    python benchmarks/gpu/share_gpu.py --dry-run   # anywhere: same plumbing on CPU, tiny sizes, no results file

``--out PATH`` names the JSON file (also in a dry run); it is rewritten after the correctness check
and after every throughput run, so a run stopped part-way keeps what it measured.
``--budget SECONDS`` starts no throughput run that would likely end past the budget (the estimate
is the slowest run so far, at least warm-up + window + 15 s); the skipped ones are recorded as
``"skipped: budget"``. A measurement in which a consumer raised, a DataLoader worker died or the
producer exited gets ``null`` and ``<mode>_error`` instead of a number. Each prints one line with
its duration split (start-up to the first batch, warm-up + window, teardown), also kept as
``<mode>_seconds``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import _share_measure
import share_cpu

CTX = _share_measure.CTX


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


def _gpu_batches(kind: str, arg: Any, device: str) -> Any:
    """A GPU consumer: move every batch to ``device`` and run ``_step`` on it; yield its size."""
    source = share_cpu.consumer_source(kind, arg)  # one source for the whole run, iterated epoch after epoch
    batches = iter(source)  # a DataLoader forks its workers here, before CUDA is initialised
    conv = torch.nn.Conv2d(3, 8, 3).to(device)
    while True:
        for x, _y in batches:
            _step(x.to(device, non_blocking=True), conv)
            yield len(x)
        batches = iter(source)


def throughput(mode: str, k: int, workers: int, device: str, warmup: float, window: float, seq: int,
               epoch: int = 8192) -> tuple[float, dict[str, float]]:
    """Aggregate samples/s of ``k`` GPU consumers over one common window, and where the time went (s).

    ``epoch`` is the samples per epoch of the loaders (tensorsocket's producer keeps its default).
    The window starts ``warmup`` s after the last consumer's first batch (_share_measure.throughput).
    """
    if mode == "independent":
        kind, arg, producer = "independent", (max(1, workers // k), epoch), None
    elif mode in ("share-cuda", "share-cpu-ring"):
        kind, arg = "share", share_cpu.endpoint("share", seq)
        ring = device if mode == "share-cuda" else "cpu"
        producer = (share_cpu.serve, ("share", arg, workers, "jpeg", ring, epoch))
    else:
        kind, arg = "tensorsocket", share_cpu.endpoint("tensorsocket", seq)
        producer = (share_cpu.serve, ("tensorsocket", arg, workers))
    return _share_measure.throughput(_gpu_batches, (kind, arg, device), k, warmup, window, producer)


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
                              "correctness": None, "single": None, "throughput": []}

    def save() -> None:
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            tmp = out.with_name(out.name + ".tmp")
            tmp.write_text(json.dumps(result, indent=2) + "\n")
            os.replace(tmp, out)

    t0 = time.monotonic()
    checks = correctness(args.device, 200 if args.dry_run else 5000, 8 if args.dry_run else 3 * 64 * 64,
                         2 if args.dry_run else 5)
    result["correctness"] = checks
    save()
    print(f"correctness: {checks} [{time.monotonic() - t0:.1f} s]", flush=True)
    modes = ["independent", "share-cuda", "share-cpu-ring"] + ([] if args.skip_tensorsocket else ["tensorsocket"])
    if args.dry_run:
        modes = [m for m in modes if m not in ("share-cuda", "tensorsocket")]  # CUDA-only paths
    slowest = args.warmup + args.window + 15.0

    def measure(row: dict[str, Any], key: str, mode: str, k: int, seq: int) -> None:
        """Run one configuration into ``row[key]`` (``row[key + "_error"]`` if it failed) and print it."""
        nonlocal slowest
        if args.budget is not None and time.monotonic() - begin + slowest > args.budget:
            row[key], row[f"{key}_error"] = None, "skipped: budget"
            print(f"K={k} {mode}: skipped (budget of {args.budget:g} s)", flush=True)
            return
        t0 = time.monotonic()
        try:
            row[key], split = throughput(mode, k, args.workers, args.device, args.warmup, args.window, seq,
                                         epoch=640 if args.dry_run else 8192)  # dry: several epochs a window
            row[f"{key}_seconds"] = split
            shown = f"{row[key]:.0f} samples/s ({', '.join(f'{n} {v:g} s' for n, v in split.items())})"
        except Exception as exc:
            row[key], row[f"{key}_error"] = None, repr(exc)
            shown = f"failed: {exc!r}"
        took = time.monotonic() - t0
        slowest = max(slowest, took)
        label = f"K={k} {mode}" + ("" if key == mode else f" ({key})")
        print(f"{label}: {shown} [took {took:.1f} s; {time.monotonic() - begin:.0f} s since start]", flush=True)
        save()

    single = result["single"] = {}  # the reference T1: one consumer with one DataLoader of all the workers
    measure(single, "T1", "independent", 1, 0)
    rows, seq = result["throughput"], 1
    for k in args.consumers:
        row: dict[str, Any] = {"K": k, "single_T1": single["T1"]}
        rows.append(row)
        for mode in modes:
            seq += 1
            measure(row, mode, mode, k, seq)
    result["seconds"] = round(time.monotonic() - begin, 1)
    print(json.dumps(result, indent=2))
    save()
    if out is not None:
        print(f"wrote {out}")
    if any(status != "ok" for status, _ in checks):
        sys.exit(1)


if __name__ == "__main__":
    main()
