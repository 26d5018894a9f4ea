"""A test job: the emulated training job (``collocate.node.emulate_job``) without the CLI's imports.

Usage: python job.py MEM_MIB SECONDS [PEAK_MIB [SM]] [--startup S] [--warmup W] [--dram D]
[--steps-per-s N] [--ramp R]
[anything else, e.g. --job mlp --out runs/a, which only names the job] — starts in a fraction of
the time of ``collocate emulate-job``, which keeps the end-to-end tests fast on a 2-core machine.
"""

import os
import sys

from collocate.gpus.emulated import state_dir_from_env
from collocate.node.emulate_job import JobSpec, run_job

args = sys.argv[1:]
options = {name: float(args[args.index(name) + 1])
           for name in ("--startup", "--warmup", "--dram", "--steps-per-s", "--ramp")
           if name in args}
positional = [a for a in args[:4] if not a.startswith("--")]
mem, seconds = float(positional[0]), float(positional[1])
peak = float(positional[2]) if len(positional) > 2 and positional[2] != "-" else None
sm = float(positional[3]) if len(positional) > 3 else 0.1
spec = JobSpec(mem_mib=mem, seconds=seconds, ramp_s=options.get("--ramp", 0.0), peak_mib=peak, peak_at=0.3, sm=sm,
               dram=options.get("--dram", 0.05), startup_s=options.get("--startup", 0.0),
               warmup_s=options.get("--warmup", 0.0), steps_per_s=options.get("--steps-per-s", 0.0))
sys.exit(run_job(spec, state_dir_from_env(None), os.environ))
