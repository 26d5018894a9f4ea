"""A test job: the emulated training job (``collocate.gpus.emulate_job``) without the CLI's imports.

Usage: python job.py MEM_MIB SECONDS [PEAK_MIB [SM]] — starts in a fraction of the time of
``collocate emulate-job``, which keeps the end-to-end tests fast on a 2-core machine.
"""

import os
import sys

from collocate.gpus.emulate_job import JobSpec, run_job
from collocate.gpus.emulated import state_dir_from_env

mem, seconds = float(sys.argv[1]), float(sys.argv[2])
peak = float(sys.argv[3]) if len(sys.argv) > 3 and sys.argv[3] != "-" else None
sm = float(sys.argv[4]) if len(sys.argv) > 4 else 0.1
spec = JobSpec(mem_mib=mem, seconds=seconds, ramp_s=0.0, peak_mib=peak, peak_at=0.3, sm=sm, dram=0.05)
sys.exit(run_job(spec, state_dir_from_env(None), os.environ))
