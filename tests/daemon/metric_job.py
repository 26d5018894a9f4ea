"""A test job that logs its own metrics (``log_metric``) and then holds emulated GPU memory.

Usage: python metric_job.py MEM_MIB SECONDS — logs ``loss`` at steps 0..4, then runs the
emulated training job, so the daemon samples both its metrics file and its GPU usage.
"""

import os
import sys

from collocate.gpus.emulated import state_dir_from_env
from collocate.monitor import log_metric
from collocate.node.emulate_job import JobSpec, run_job

mem, seconds = float(sys.argv[1]), float(sys.argv[2])
for step in range(5):
    if not log_metric("loss", 1.0 / (step + 1), step=step):
        sys.exit("COLLOCATE_METRICS_FILE is not set")
spec = JobSpec(mem_mib=mem, seconds=seconds, ramp_s=0.0, sm=0.5, dram=0.05)
sys.exit(run_job(spec, state_dir_from_env(None), os.environ))
