"""Where a CNN's reserved GPU memory goes beyond its allocated peak (a device diagnostic).

The estimator under-estimates some CNNs on the H100 (docs/estimator-accuracy.md: ResNet-18 at
64x224, VGG-16 in bf16, ResNet-18 on CIFAR input) and there ``max_memory_reserved`` is 1.4-1.7x
``max_memory_allocated``, against about 1.2 for ResNet-50. The estimator simulates the caching
allocator on the CPU trace plus a cuDNN workspace allowance, so the question is which of them
misses: the GPU's extra allocations (cuDNN/cuBLAS workspaces, seen nowhere on the CPU) or the
allocator's segment growth.

Each configuration of ``estimator_ground_truth.py`` named here runs in a fresh process, once
with the default allocator and once with ``expandable_segments:True``, with PyTorch's allocator
history recorded (C++ stacks included). Written per run: the peaks and the allocator's counters;
every segment the allocator created, in order, with its size and the allocation that made it
grow (size, and whether cuDNN or cuBLAS was on its stack); and the cuDNN/cuBLAS allocations
(largest, total count).

    python benchmarks/gpu/allocator_probe.py --out probe.json              # on the GPU
    python benchmarks/gpu/allocator_probe.py --only resnet18-b64-sgd-fp32 --out p.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from estimator_ground_truth import CONFIGS, Config, run_child  # noqa: E402

DEFAULT = ["resnet18-b64-sgd-fp32", "resnet18_cifar-b128-sgd-fp32", "tv_vgg16-b64-sgd-bf16",
           "resnet50-b64-sgd-fp32"]
VARIANTS = {"default": "", "expandable": "expandable_segments:True"}
MIB = 2**20


def _library(frames: list[dict[str, Any]]) -> str:
    """Which GPU library asked for an allocation, read from its C++ stack."""
    names = " ".join(f.get("name", "") for f in frames).lower()
    if "cudnn" in names:
        return "cudnn"
    if "cublas" in names:
        return "cublas"
    return "torch"


def summarize(snapshot: dict[str, Any]) -> dict[str, Any]:
    """Segments created (in order, with the allocation that made each) and the libraries' own
    allocations, from ``torch.cuda.memory._snapshot()``."""
    trace = snapshot["device_traces"][0]
    segments, by_lib = [], {"cudnn": [], "cublas": []}
    pending_segment = None
    for event in trace:
        action, size = event["action"], event["size"]
        if action in ("segment_alloc", "segment_map"):  # map: expandable segments
            pending_segment = size
        elif action == "alloc":
            lib = _library(event.get("frames", []))
            if lib in by_lib:
                by_lib[lib].append(size)
            if pending_segment is not None:
                segments.append({"segment_mib": round(pending_segment / MIB, 1),
                                 "for_alloc_mib": round(size / MIB, 2), "by": lib})
                pending_segment = None
    live = snapshot["segments"]
    return {
        "segments_created": segments,
        "segments_created_by": {lib: round(sum(s["segment_mib"] for s in segments
                                               if s["by"] == lib), 1)
                                for lib in ("cudnn", "cublas", "torch")},
        "segments_at_end": len(live),
        "reserved_at_end_mib": round(sum(s["total_size"] for s in live) / MIB, 1),
        "allocated_at_end_mib": round(sum(s["allocated_size"] for s in live) / MIB, 1),
        **{f"{lib}_allocs": len(sizes) for lib, sizes in by_lib.items()},
        **{f"{lib}_largest_mib": round(max(sizes, default=0) / MIB, 1)
           for lib, sizes in by_lib.items()},
        "trace_events": len(trace),
    }


def child(cfg: Config, dry_run: bool) -> dict[str, Any]:
    import torch

    record = not dry_run and torch.cuda.is_available()
    if record:
        torch.cuda.memory._record_memory_history(max_entries=500_000, stacks="all")
    row = run_child(cfg, dry_run)
    if record:
        row.update(summarize(torch.cuda.memory._snapshot()))
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", action="append", help="configuration name (repeatable)")
    ap.add_argument("--out", type=Path, required=True, help="JSON file to write")
    ap.add_argument("--dry-run", action="store_true", help="CPU: build and one step, no probe")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(Config(**json.loads(args.child)), args.dry_run)))
        return 0
    names = args.only or DEFAULT
    by_name = {c.name: c for c in CONFIGS}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        ap.error(f"unknown configuration(s) {unknown}; see estimator_ground_truth.py CONFIGS")
    runs = []
    for name in names:
        for variant, conf in VARIANTS.items():
            env = {**os.environ, "PYTORCH_CUDA_ALLOC_CONF": conf} if conf else dict(os.environ)
            argv_child = [sys.executable, __file__, "--child", json.dumps(asdict(by_name[name])),
                          "--out", str(args.out)] + (["--dry-run"] if args.dry_run else [])
            done = subprocess.run(argv_child, env=env, capture_output=True, text=True,
                                  timeout=300)
            if done.returncode:
                row = {"status": "error", "error": done.stderr[-2000:]}
            else:
                row = json.loads(done.stdout.strip().splitlines()[-1])
            runs.append({"config": name, "allocator": variant, **row})
            print(f"{name} [{variant}]: status {row.get('status')}, allocated "
                  f"{row.get('max_allocated_mib')} MiB, reserved {row.get('max_reserved_mib')} "
                  f"MiB, segments by {row.get('segments_created_by')}", flush=True)
    result = {"benchmark": "allocator_probe",
              "date_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "runs": runs}
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
