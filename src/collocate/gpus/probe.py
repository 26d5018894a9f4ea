"""Print what a GPU backend sees: devices, two samples, and (NVML) which metrics work.

For GPU sessions that validate the NVML path on new hardware::

    python -m collocate.gpus.probe                 # NVML
    python -m collocate.gpus.probe --gpus emulated:2xA100-40GB:mig1=3g.20gb,4g.20gb

Prints one JSON document, so a session can store it beside its benchmark results.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import socket
import sys
import tempfile
import time
from pathlib import Path

from collocate.common.errors import CollocateError
from collocate.gpus.registry import open_backend


def probe(spec: str, *, state_dir: Path, interval_s: float = 1.0) -> dict[str, object]:
    """Open ``spec``, sample twice ``interval_s`` apart (GPM needs two), and describe it all."""
    backend = open_backend(spec, state_dir=state_dir, node=socket.gethostname())
    try:
        devices = [dataclasses.asdict(d) for d in backend.devices()]
        first = backend.sample()
        time.sleep(interval_s)
        second = backend.sample()
        capabilities = getattr(backend, "capabilities", None)
        return {
            "backend": backend.name,
            "devices": devices,
            "samples": [[dataclasses.asdict(s) for s in batch] for batch in (first, second)],
            "capabilities": capabilities() if capabilities else None,
        }
    finally:
        backend.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m collocate.gpus.probe", description=__doc__)
    parser.add_argument("--gpus", default="nvml", help="nvml, auto or emulated:<spec>")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between samples")
    parser.add_argument("--state-dir", type=Path, default=None,
                        help="state for emulated GPUs (default: a temporary directory)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="collocate-probe-") as tmp:
        try:
            state_dir = args.state_dir or Path(tmp)
            report = probe(args.gpus, state_dir=state_dir, interval_s=args.interval)
        except CollocateError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    json.dump(report, sys.stdout, indent=2, default=str)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
