"""Run a Python module or script so that SIGINT and SIGTERM raise ``KeyboardInterrupt``.

    python3 benchmarks/gpu/sigrun.py -m collocate.cli bench run ...
    python3 benchmarks/gpu/sigrun.py benchmarks/gpu/share_gpu.py --out x.json

Why: ``round.sh`` ends each step at its time limit with ``timeout -s INT``. A Python started with
SIGINT ignored (as a background job of a non-interactive shell is) would not notice, and
SIGTERM kills Python without running ``finally`` blocks. With both raising ``KeyboardInterrupt``
the harness's own clean-up runs: the bench runner kills its workers' process groups and stops
MPS, the mini-trace cancels its daemon's jobs and stops the daemon, the estimator's child is
killed, share_gpu's processes are terminated.
"""

from __future__ import annotations

import runpy
import signal
import sys


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main() -> None:
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    args = sys.argv[1:]
    if not args:
        sys.exit(__doc__)
    if args[0] == "-m":
        sys.argv = [args[1], *args[2:]]
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(args)
        runpy.run_path(args[0], run_name="__main__")


if __name__ == "__main__":
    main()
