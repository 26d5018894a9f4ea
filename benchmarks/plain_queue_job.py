"""One emulated training job of ``plain_queue.py``'s mix: a start-up with no GPU use, a memory
ramp, first steps, then steady activity, its steps reported with ``log_metric`` as a training
loop logs them (``collocate.node.emulate_job``); ``--peak-mib`` at ``--peak-at`` of its progress
is memory that grows late. What it really uses is independent of what it was submitted with.

``python benchmarks/plain_queue_job.py --mem-mib M --seconds S [--peak-mib P --peak-at F]
[--sm A --dram D --startup S --warmup W] --name NAME`` (the name only tells jobs apart).
"""

from __future__ import annotations

import argparse
import os
import sys

STEPS_PER_S = 4.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mem-mib", type=float, required=True)
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--peak-mib", type=float)
    parser.add_argument("--peak-at", type=float, default=0.5)
    parser.add_argument("--sm", type=float, default=0.5)
    parser.add_argument("--dram", type=float, default=0.2)
    parser.add_argument("--startup", type=float, default=0.0)
    parser.add_argument("--warmup", type=float, default=0.0)
    parser.add_argument("--ramp", type=float, default=2.0)
    parser.add_argument("--name", default="")
    args = parser.parse_args(argv)
    from collocate.gpus.emulated import state_dir_from_env
    from collocate.node.emulate_job import JobSpec, run_job

    spec = JobSpec(mem_mib=args.mem_mib, seconds=args.seconds, sm=args.sm, dram=args.dram,
                   ramp_s=args.ramp, peak_mib=args.peak_mib, peak_at=args.peak_at,
                   startup_s=args.startup, warmup_s=args.warmup, steps_per_s=STEPS_PER_S)
    return run_job(spec, state_dir_from_env(None), os.environ)


if __name__ == "__main__":
    sys.exit(main())
