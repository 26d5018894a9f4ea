"""Does a change to the simulator change any decision? Runs the same traces, policies and
configurations under two source trees and compares every job's record bit for bit.

    python benchmarks/sim_same.py OLD_SRC NEW_SRC [--jobs 2000] [--seeds 1,2,3]

Each ``SRC`` is a ``src`` folder (e.g. one unpacked with ``git archive <commit> | tar -x``); each
runs in a Python process of its own with that folder first on its path. Compared per run: every
job's first start, end, state, attempts, out-of-memory crashes and each attempt's GPUs, start,
end and outcome (floats by ``repr``, so bit for bit), and the run's makespan, energy, decisions
and wait counts. Prints one line per run and exits 1 on the first difference it reports.

Why a script and not a test: the check needs the tree before the change, which a test in the
tree cannot hold. Speed work on the simulator is done when this prints no difference.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

# (policy, SimConfig keyword arguments): the paths a speed change can touch. Whole GPUs with
# exact profiles, learning from nothing, a start-up and warm-up, estimated memory (a watched
# ramp, crashes), the model's calibration error, MPS, MIG instances.
CASES: list[tuple[str, dict]] = [
    ("auto", {}),
    ("carma-magm", {}),
    ("auto", {"profiles": "unknown", "startup_s": 30.0}),
    ("auto", {"estimator": "faketensor", "model_error_seed": 7}),
    ("carma-magm", {"estimator": "horus"}),
    ("exclusive", {}),
    ("auto", {"sharing": "mps"}),
    ("carma-magm", {"sharing": "mps"}),
    ("auto", {"mig_layout": "3g.40gb+4g.40gb"}),
]

_CHILD = r"""
import json, sys
from collocate.core.gputypes import parse_cluster
from collocate.core.model import SharingMode
from collocate.core.policies import make_policy
from collocate.sim.engine import SimConfig, Simulation
from collocate.sim.synth import synthetic_trace

jobs, seed, policy, kwargs = json.loads(sys.argv[1])
if "mig_layout" in kwargs and hasattr(SharingMode, "MIG"):  # a tree from before MIG left the modes
    kwargs["sharing"] = "mig"
if "sharing" in kwargs:
    kwargs["sharing"] = SharingMode(kwargs["sharing"])
nodes = parse_cluster("25x(8xA100-80GB)")
trace = synthetic_trace(jobs, gpus=200, gpu_mem_mib=81_920, seed=seed)
result = Simulation(nodes, trace, make_policy(policy), SimConfig(**kwargs)).run()
out = {"makespan": repr(result.makespan_s), "energy": repr(result.energy_j),
       "decisions": result.decisions, "waits": result.waits,
       "jobs": [[r.id, repr(r.start), repr(r.end), r.state, r.attempts, r.oom_crashes,
                 [[g, repr(s), repr(e), o] for g, s, e, o in r.spans]] for r in result.records]}
print(json.dumps(out))
"""


def run(src: str, jobs: int, seed: int, policy: str, kwargs: dict) -> dict:
    env = {**os.environ, "PYTHONPATH": os.path.abspath(src), "PYTHONHASHSEED": "0"}
    done = subprocess.run([sys.executable, "-c", _CHILD, json.dumps([jobs, seed, policy, kwargs])],
                          env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"{src}: {policy} {kwargs} seed {seed} failed:\n{done.stderr}")
    return json.loads(done.stdout)


def first_difference(old: dict, new: dict) -> str | None:
    for key in ("makespan", "energy", "decisions", "waits"):
        if old[key] != new[key]:
            return f"{key}: {old[key]} != {new[key]}"
    if len(old["jobs"]) != len(new["jobs"]):
        return f"{len(old['jobs'])} jobs != {len(new['jobs'])}"
    for a, b in zip(old["jobs"], new["jobs"], strict=True):
        if a != b:
            return f"job {a[0]}: {a} != {b}"
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("old_src")
    parser.add_argument("new_src")
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--seeds", default="1,2,3")
    args = parser.parse_args()
    for seed in (int(s) for s in args.seeds.split(",")):
        for policy, kwargs in CASES:
            old = run(args.old_src, args.jobs, seed, policy, kwargs)
            new = run(args.new_src, args.jobs, seed, policy, kwargs)
            diff = first_difference(old, new)
            print(f"seed {seed} {policy} {kwargs}: {len(new['jobs'])} jobs, {new['decisions']} decisions, "
                  f"{'identical' if diff is None else 'DIFFERENT: ' + diff}", flush=True)
            if diff is not None:
                sys.exit(1)
    print("identical")


if __name__ == "__main__":
    main()
