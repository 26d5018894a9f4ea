"""Benchmark: shared data loading on CPU (collocate.share vs independent loaders vs tensorsocket).

A CPU-bound pipeline (JPEG decode + random crop + flip + normalise on generated images) feeds K
consumers that do almost nothing, so loading is the bottleneck. Side by side, in one run:

  single       one DataLoader with W workers and one consumer: the reference throughput T1
  independent  K consumers, each with its own DataLoader of W/K workers (same total workers)
  share        one collocate.share producer (W workers) and K SharedLoader consumers
  tensorsocket one tensorsocket 0.0.5 TensorProducer (W workers) and K TensorConsumers

and reports aggregate samples/s (sum over consumers), all consumers counted over one common window
(``--window`` s, starting ``--warmup`` s after the last consumer's first batch; _share_measure.py,
shared with gpu/share_gpu.py). A measurement in which a consumer raised or got no batch, a
DataLoader worker died or the producer exited is recorded as null plus ``<mode>_error`` in the
JSON and as "error" with its reason in the markdown, never as a number. Goal: share >= 0.9 * K * T1
and ahead of tensorsocket. A second part measures transport cost per batch against a plain memory copy.

    python benchmarks/share_cpu.py            # full run, writes benchmarks/results/share_cpu-<date>.{json,md}
    python benchmarks/share_cpu.py --quick    # short smoke run, prints only
"""

from __future__ import annotations

import argparse
import ctypes
import io
import itertools
import json
import math
import os
import platform
import random
import socket
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _share_measure

SIZE, CROP = 160, 128
MEAN = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
STD = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)
CTX = _share_measure.CTX


# ---------------------------------------------------------------- the pipeline
def _jpeg(seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, size=(SIZE // 8, SIZE // 8, 3), dtype=np.uint8)
    img = np.asarray(Image.fromarray(small).resize((SIZE, SIZE), Image.BICUBIC))
    noisy = np.clip(img.astype(np.int16) + rng.integers(-12, 12, size=img.shape), 0, 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(noisy).save(out, format="JPEG", quality=90)
    return out.getvalue()


class JpegDataset(Dataset):
    """Encoded JPEGs in memory; every access decodes and augments one (the CPU-heavy part)."""

    def __init__(self, images: int, length: int) -> None:
        self.images = [_jpeg(i) for i in range(images)]
        self.length = length

    def __len__(self) -> int:
        return self.length  # long epochs, so no system's epoch-boundary cost dominates a short window

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        img = Image.open(io.BytesIO(self.images[i % len(self.images)])).convert("RGB")
        x0, y0 = random.randint(0, SIZE - CROP), random.randint(0, SIZE - CROP)
        img = img.crop((x0, y0, x0 + CROP, y0 + CROP))
        if random.random() < 0.5:
            img = img.transpose(Image.FLIP_LEFT_RIGHT)
        x = torch.from_numpy(np.asarray(img, dtype=np.uint8).copy()).permute(2, 0, 1).float().div_(255)
        return (x - MEAN) / STD, torch.tensor(i)


def make_loader(workers: int, batch_size: int = 32, images: int = 128, length: int = 8192) -> DataLoader:
    return DataLoader(JpegDataset(images, length), batch_size=batch_size, num_workers=workers, shuffle=True,
                      persistent_workers=workers > 0, drop_last=True)


# ---------------------------------------------------------------- process bodies
class _MemorySource:
    """Pre-made CIFAR-sized batches (no decode): isolates the transport in the light comparison."""

    def __init__(self) -> None:
        self.batches = [(torch.randn(32, 3, 32, 32), torch.arange(32)) for _ in range(16)]

    def __len__(self) -> int:
        return 256

    def __iter__(self) -> Any:
        return (self.batches[i % 16] for i in range(256))


class _Cycle:
    """``length`` batches per epoch, cycling through a few pre-made ones."""

    def __init__(self, batches: list[Any], length: int) -> None:
        self.batches, self.length = batches, length

    def __len__(self) -> int:
        return self.length

    def __iter__(self) -> Any:
        return (self.batches[i % len(self.batches)] for i in range(self.length))


def endpoint(kind: str, seq: int) -> Any:
    """Where the producer of measurement ``seq`` serves: a share name, or tensorsocket's four ports."""
    if kind == "share":
        return f"bench-{os.getpid()}-{seq}"
    base = 20000 + (os.getpid() % 1000) * 20 + seq * 4
    return (base, base + 1, base + 2, base + 3)


def serve(kind: str, where: Any, workers: int, source: str = "jpeg", device: str = "cpu",
          epoch: int = 8192) -> None:
    """A producer's body: the JPEG pipeline (``epoch`` samples an epoch) or pre-made batches, served
    by collocate.share (ring on ``device``) or by a tensorsocket TensorProducer, until stopped."""
    loader = make_loader(workers, length=epoch) if source == "jpeg" else _MemorySource()
    if kind == "share":
        from collocate import share

        share.serve(loader, where, slots=8, device=device)
        return
    from tensorsocket import TensorProducer

    producer = TensorProducer(loader, port=where[0], ack_port=where[1], heart_ports=(where[2], where[3]),
                              rubber_band_pct=0.02)
    while True:
        for _ in producer:
            pass


def consumer_source(kind: str, arg: Any) -> Any:
    """What one consumer iterates: its own DataLoader (``arg`` = (workers, epoch)), a SharedLoader
    (``arg`` = name) or a TensorConsumer (``arg`` = ports); batches of 32 in every case."""
    if kind == "independent":
        return make_loader(arg[0], length=arg[1])  # persistent workers: started once, reused every epoch
    if kind == "share":
        from collocate import share

        return share.SharedLoader(arg, 32, connect_timeout=_share_measure.FIRST_BATCH_TIMEOUT_S)
    from tensorsocket import TensorConsumer

    return TensorConsumer(port=arg[0], ack_port=arg[1], heart_ports=(arg[2], arg[3]), batch_size=32)


def consumer_batches(kind: str, arg: Any) -> Iterator[int]:
    """A CPU consumer: touch every batch, as a training step would, and yield its size, epoch after epoch."""
    source = consumer_source(kind, arg)
    batches = iter(source)
    while True:
        for x, _y in batches:
            float(x[0, 0, 0, 0])
            yield len(x)
        batches = iter(source)


def bench_mode(mode: str, k: int, workers: int, warmup: float, window: float, seq: int,
               source: str = "jpeg") -> float:
    """Aggregate samples/s of ``k`` consumers of ``mode`` over one common window (see _share_measure).

    ``single`` is one consumer with its own DataLoader of all ``workers``; ``independent`` gives
    each of the ``k`` consumers its own DataLoader of ``workers // k``; ``share`` and ``tensorsocket``
    run one producer of ``workers`` for the ``k`` consumers. Raises RuntimeError if it failed.
    """
    producer = None
    if mode == "single":
        k, kind, arg = 1, "independent", (workers, 8192)
    elif mode == "independent":
        kind, arg = "independent", (max(1, workers // k), 8192)
    else:
        kind, arg = mode, endpoint(mode, seq)
        producer = (serve, (mode, arg, workers, source))
    samples_per_s, _split = _share_measure.throughput(consumer_batches, (kind, arg), k, warmup, window, producer)
    return samples_per_s


# ---------------------------------------------------------------- transport cost
def _transport_producer(name: str, shape: tuple[int, ...], n_batches: int) -> None:
    from collocate import share

    batches = [(torch.randn(*shape), torch.arange(shape[0])) for _ in range(n_batches)]
    share.serve(_Cycle(batches, 512), name, slots=8)  # long epochs: measure the steady state


def _transport_consumer(name: str, batch: int, count: int, out: Any) -> None:
    from collocate import share

    loader = share.SharedLoader(name, batch, connect_timeout=120)
    stamps: list[float] = []
    while len(stamps) < count + 8:
        for x, _ in loader:
            float(x[0].flatten()[0])
            stamps.append(time.perf_counter())
            if len(stamps) >= count + 8:
                break
    gaps = sorted(b - a for a, b in itertools.pairwise(stamps[8:]))  # steady state: skip the first fill
    out.put(gaps[len(gaps) // 2])


def _median_copy_s(srcs: list[torch.Tensor], dsts: list[torch.Tensor], reps: int) -> float:
    times = []
    for i in range(reps):
        t0 = time.perf_counter()
        dsts[i % len(dsts)].copy_(srcs[i % len(srcs)])
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def _median_memmove_s(srcs: list[torch.Tensor], dsts: list[torch.Tensor], reps: int) -> float:
    """Like ``_median_copy_s`` with one thread's ``memmove`` (what the producer does per field)."""
    times = []
    for i in range(reps):
        src, dst = srcs[i % len(srcs)], dsts[i % len(dsts)]
        t0 = time.perf_counter()
        ctypes.memmove(dst.data_ptr(), src.data_ptr(), src.nbytes)
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def bench_transport(shape: tuple[int, ...], count: int, seq: int) -> dict[str, float]:
    """Per-batch cost of the share pipeline vs a plain copy of the batch (medians; shared machine).

    Two baselines: the same source into the same destination (cache-hot, the cheapest possible
    copy), and 16 sources into 8 rotating destinations, which is the memory traffic the ring
    itself sees (16 distinct source batches, 8 slots). Both use ``Tensor.copy_``, which runs on
    torch's OpenMP team (all cores, workers spinning between back-to-back copies). For reference
    only, the rotating copy is also timed with one thread's ``memmove``, which is how the
    producer copies (see docs/shared-loading.md, "Transport cost").
    """
    srcs = [torch.randn(*shape) for _ in range(16)]
    dsts = [torch.empty(*shape) for _ in range(8)]
    reps = max(32, min(400, int(4e9 / srcs[0].nbytes)))
    hot_s = _median_copy_s(srcs[:1], dsts[:1], reps)
    rotating_s = _median_copy_s(srcs, dsts, reps)
    memmove_s = _median_memmove_s(srcs, dsts, reps)
    del srcs, dsts
    queue = CTX.Queue()
    name = f"transport-{os.getpid()}-{seq}"
    procs = [CTX.Process(target=_transport_producer, args=(name, shape, 16)),
             CTX.Process(target=_transport_consumer, args=(name, shape[0], count, queue))]
    for p in procs:
        p.start()
    try:
        per_batch = queue.get(timeout=180)
    finally:
        for p in procs:
            p.terminate()
            p.join(10)
    return {"batch_mib": 4 * math.prod(shape) / 2**20, "memcpy_hot_ms": hot_s * 1e3,
            "memcpy_rotating_ms": rotating_s * 1e3, "share_ms_per_batch": per_batch * 1e3,
            "ratio_vs_rotating": per_batch / rotating_s, "ratio_vs_hot": per_batch / hot_s,
            "memmove_1thread_rotating_ms": memmove_s * 1e3, "ratio_vs_memmove_1thread": per_batch / memmove_s}


def _echo(address: str) -> None:
    """Answer every datagram on ``address`` with itself until the peer closes."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.connect(address)
    while data := sock.recv(64):
        sock.send(data)


def socket_round_trip_us(n: int = 5000) -> dict[str, float]:
    """The floor under any per-batch message: Python to Python over AF_UNIX SOCK_SEQPACKET, one
    8-byte datagram there and back, blocking reads (median, p10 and p90 of ``n``)."""
    address = f"\0collocate-bench-rtt-{os.getpid()}"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(address)
    listener.listen(1)
    proc = CTX.Process(target=_echo, args=(address,))
    proc.start()
    try:
        listener.settimeout(120)
        conn, _ = listener.accept()
        conn.settimeout(None)
        times = []
        for i in range(n + 200):
            t0 = time.perf_counter()
            conn.send(i.to_bytes(8, "little"))
            conn.recv(64)
            times.append(time.perf_counter() - t0)
        conn.close()
    finally:
        listener.close()
        proc.join(10)
        if proc.is_alive():
            proc.kill()
    times = sorted(times[200:])
    return {f"p{q}": times[len(times) * q // 100] * 1e6 for q in (10, 50, 90)}


# ---------------------------------------------------------------- report
def machine() -> dict[str, Any]:
    model = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            model = next((ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")), model)
    except OSError:
        pass
    return {"cpu_model": model, "cores": os.cpu_count(), "device": "cpu", "torch": torch.__version__,
            "python": platform.python_version(), "os": platform.platform(),
            "load_average_at_start": os.getloadavg()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=4, help="total DataLoader workers per configuration")
    ap.add_argument("--consumers", type=int, nargs="+", help="values of K (default: 2 4; with --quick: 2)")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved repetitions; medians are reported")
    ap.add_argument("--warmup", type=float, default=3.0)
    ap.add_argument("--window", type=float, default=20.0,
                    help="seconds counted; tensorsocket delivers bursts about 10 s apart on a 2-core "
                    "machine, so shorter windows round it to a burst count or 0")
    ap.add_argument("--quick", action="store_true", help="one short round, K = 2 only, no result files")
    ap.add_argument("--skip-tensorsocket", action="store_true")
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.warmup, args.window = 1, 2.0, 3.0
    if args.consumers is None:
        args.consumers = [2] if args.quick else [2, 4]
    info = machine()
    print(json.dumps(info), flush=True)
    modes = ["independent", "share"] + ([] if args.skip_tensorsocket else ["tensorsocket"])
    samples: dict[str, list[float | None]] = {}
    failures: dict[str, list[str]] = {}
    seq = 0

    def record(key: str, fn: Any) -> None:
        nonlocal seq
        seq += 1
        try:
            value: float | None = fn(seq)
            shown = f"{value:.0f} samples/s"
        except Exception as exc:  # recorded as null plus the reason, never as a number
            value, shown = None, f"error: {exc!r}"
            failures.setdefault(key, []).append(repr(exc) if args.rounds == 1 else f"round {rnd}: {exc!r}")
        samples.setdefault(key, []).append(value)
        print(f"{key}: {shown}", flush=True)

    for rnd in range(1, args.rounds + 1):  # noqa: B007 (record() reads it); interleaved so load from other users hits every configuration alike
        record("single", lambda q: bench_mode("single", 1, args.workers, args.warmup, args.window, q))
        for k in args.consumers:
            for mode in modes:
                record(f"{mode}/K={k}", lambda q, m=mode, k=k: bench_mode(m, k, args.workers, args.warmup,
                                                                        args.window, q))
        for mode in modes[1:]:
            record(f"light-{mode}/K=2", lambda q, m=mode: bench_mode(m, 2, 0, args.warmup, args.window, q, "memory"))

    errors = {key: "; ".join(why) for key, why in failures.items()}
    rows, light = summarize(samples, errors, args.consumers, modes)
    ts_pickle = None if args.skip_tensorsocket else tensorsocket_pickle()
    transport = []
    for i, shape in enumerate([(32, 3, 32, 32), (32, 3, 128, 128), (64, 3, 224, 224)]):
        transport.append({"shape": list(shape), **bench_transport(shape, 30 if args.quick else 200, 1000 + i)})
        print(f"transport {shape}: {transport[-1]}", flush=True)
    rtt = socket_round_trip_us(1000 if args.quick else 5000)
    print(f"socket round trip (us): {rtt}", flush=True)
    result = {"benchmark": "share_cpu", "date": datetime.now(UTC).isoformat(timespec="seconds"),
              "machine": info, "settings": vars(args), "throughput": rows, "light_pipeline_K2": light, "tensorsocket_pickle": ts_pickle,
              "all_measurements": samples, "errors": errors, "transport": transport, "socket_round_trip_us": rtt}
    if args.quick:
        print(json.dumps(result, indent=2))
        return
    out_dir = Path(__file__).parent / "results"
    out_dir.mkdir(exist_ok=True)
    stem = out_dir / f"share_cpu-{datetime.now(UTC):%Y-%m-%d}"
    stem.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    stem.with_suffix(".md").write_text(markdown(result))
    print(f"wrote {stem}.json and .md")


def tensorsocket_pickle() -> dict[str, float]:
    """Bytes tensorsocket's CPU path sends for one consumer batch (it pickles the whole storage)."""
    import pickle
    import warnings

    from tensorsocket.payload import TensorPayload

    producer_batch = torch.randn(8 * 32, 3, CROP, CROP)  # producer_batch_size=8 loader batches of 32
    piece = producer_batch[:32]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        size = len(pickle.dumps(TensorPayload(piece)))
    return {"slice_mib": piece.nbytes / 2**20, "pickled_mib": size / 2**20}


def summarize(samples: dict[str, list[float | None]], errors: dict[str, str], consumers: list[int],
              modes: list[str]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The throughput rows (one per K) and the light-pipeline entry from every run's samples/s.

    A value is the median of the runs that succeeded, null if none did; ``<mode>_error`` (and
    ``single_T1_error``) holds the reason whenever a run of it failed.
    """
    med = {key: _median(vals) for key, vals in samples.items()}

    def entry(name: str, key: str) -> dict[str, Any]:
        return {name: med.get(key), **({f"{name}_error": errors[key]} if key in errors else {})}

    t1 = med.get("single")
    rows = []
    for k in consumers:
        row: dict[str, Any] = {"K": k, **entry("single_T1", "single")}
        for m in modes:
            row.update(entry(m, f"{m}/K={k}"))
        row["share_over_K_T1"] = row["share"] / (k * t1) if row["share"] and t1 else None
        row["independent_over_T1"] = row["independent"] / t1 if row["independent"] and t1 else None
        row["share_over_tensorsocket"] = (row["share"] / row["tensorsocket"]
                                          if row.get("tensorsocket") and row["share"] else None)
        rows.append(row)
    light: dict[str, Any] = {}
    for m in modes[1:]:
        light.update(entry(m, f"light-{m}/K=2"))
    return rows, light


def _median(values: list[float | None]) -> float | None:
    ok = sorted(v for v in values if v is not None)
    if not ok:
        return None
    mid = len(ok) // 2
    return ok[mid] if len(ok) % 2 else (ok[mid - 1] + ok[mid]) / 2


def markdown(result: dict[str, Any]) -> str:
    m = result["machine"]
    singles = [v for v in result["all_measurements"]["single"] if v]
    t1_max = max(singles) if singles else None
    notes: dict[str, int] = {}  # "what: why" -> its number, in order of first use
    listed = 0

    def cell(entry: dict[str, Any], name: str, label: str) -> str:
        """A median, or "error"; a run that failed adds a numbered note with its reason."""
        value, why = entry.get(name), entry.get(f"{name}_error")
        shown = "n/a" if value is None and why is None else "error" if value is None else f"{value:.0f}"
        if why is not None:
            shown += f" [{notes.setdefault(f'{label}: {why}', len(notes) + 1)}]"
        return shown

    def new_notes() -> list[str]:
        """The notes of the table just written, as a list under it."""
        nonlocal listed
        fresh = list(notes)[listed:]
        listed = len(notes)
        if not fresh:
            return []
        return ["", "Errors (a failed run is left out of the median; \"error\": every run failed):", "",
                *(f"- [{notes[text]}] {text}" for text in fresh)]

    lines = [
        f"# share_cpu — {result['date']}", "",
        (f"Machine: {m['cpu_model']}, {m['cores']} cores, device {m['device']}, torch {m['torch']}, "
         f"load average at start {tuple(round(x, 1) for x in m['load_average_at_start'])} (shared machine)."), "",
        (f"Aggregate samples/s over all consumers (medians of {result['settings']['rounds']} interleaved rounds), "
         "counted over one common window that starts when the last consumer has its first batch plus the warm-up; "
         f"{result['settings']['workers']} DataLoader workers in every configuration; batch 32 of 3x128x128 "
         "float32. T1 is the single-loader median; the conservative ratio uses the best single-loader run."), "",
        ("| K | single loader T1 | (a) independent | (b) collocate.share | (c) tensorsocket 0.0.5 | (b) / (K·T1) "
         "| (b) / (K·best T1) | (b) / (a) | (b) / (c) |"),
        "|---|---|---|---|---|---|---|---|---|"]
    for r in result["throughput"]:
        k = r["K"]
        ratio_c = r.get("share_over_tensorsocket")
        best = r["share"] / (k * t1_max) if r.get("share") and t1_max else None
        vs_a = r["share"] / r["independent"] if r.get("share") and r.get("independent") else None
        lines.append(f"| {k} | {cell(r, 'single_T1', 'single loader T1')} | "
                     f"{cell(r, 'independent', f'(a) independent, K = {k}')} | "
                     f"{cell(r, 'share', f'(b) collocate.share, K = {k}')} | "
                     f"{cell(r, 'tensorsocket', f'(c) tensorsocket, K = {k}')} | {_ratio(r['share_over_K_T1'])} | "
                     f"{_ratio(best)} | {_ratio(vs_a)} | {_ratio(ratio_c)} |")
    lines += new_notes()
    raw = "; ".join(f"{k}: {', '.join('error' if v is None else f'{v:.0f}' for v in vals)}"
                    for k, vals in result["all_measurements"].items())
    lines += ["", f"All runs (samples/s): {raw}."]
    amp = result.get("tensorsocket_pickle")
    if amp:
        lines += ["", (f"tensorsocket CPU path, measured: one consumer batch of {amp['slice_mib']:.1f} MiB (a slice of "
                       f"an 8-loader-batch producer batch) pickles to {amp['pickled_mib']:.1f} MiB, because its "
                       "payload pickles the whole underlying storage; every message then crosses loopback TCP.")]
    light = result["light_pipeline_K2"]
    lines += ["", "Light pipeline (pre-made 32x3x32x32 batches in memory, no decode; K = 2; isolates the transport):", "",
              "| (b) collocate.share | (c) tensorsocket 0.0.5 |", "|---|---|",
              (f"| {cell(light, 'share', 'light, (b) collocate.share')} | "
               f"{cell(light, 'tensorsocket', 'light, (c) tensorsocket')} |")]
    lines += new_notes()
    lines += ["", ("Transport cost per batch (producer copy into the ring + control messages + consumer views), "
                   "one consumer, in-memory source; medians of per-batch intervals and of single copies. The memcpy "
                   "columns are `Tensor.copy_` (torch's OpenMP team, all cores); the last two columns are a reference "
                   "only: one thread's `memmove` over the same buffers, which is how the producer copies:"), "",
              ("| batch | MiB | memcpy, rotating buffers (ms) | memcpy, cache-hot (ms) | collocate.share ms/batch | "
               "share / rotating memcpy | share / hot memcpy | 1-thread memmove, rotating (ms) | share / 1-thread memmove |"),
              "|---|---|---|---|---|---|---|---|---|"]
    for t in result["transport"]:
        mm = t.get("memmove_1thread_rotating_ms")
        lines.append(f"| {'x'.join(map(str, t['shape']))} | {t['batch_mib']:.1f} | {t['memcpy_rotating_ms']:.3f} | "
                     f"{t['memcpy_hot_ms']:.3f} | {t['share_ms_per_batch']:.3f} | {t['ratio_vs_rotating']:.2f} | "
                     f"{t['ratio_vs_hot']:.2f} | {'n/a' if mm is None else f'{mm:.3f}'} | "
                     f"{_ratio(t.get('ratio_vs_memmove_1thread'))} |")
    rtt = result.get("socket_round_trip_us")
    if rtt:
        lines += ["", (f"One AF_UNIX SOCK_SEQPACKET round trip between two Python processes (8-byte datagram, blocking "
                       f"reads): median {rtt['p50']:.1f} us (p10 {rtt['p10']:.1f}, p90 {rtt['p90']:.1f}).")]
    return "\n".join(lines) + "\n"


def _ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


if __name__ == "__main__":
    sys.exit(main())
