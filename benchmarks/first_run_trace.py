"""The first-run trace of issue 29, as emulated jobs: 14 training jobs started through ONE script.

Issue 29 describes what a new user ran on an H100 (80 GB): 14 jobs of model families that are not
built-in workloads (timm, torchvision and transformers models built from configs, a plain PyTorch
LSTM, a U-Net and a 4-point MLP sweep), all started through one training script with ``--job
NAME`` and an output path; 1-6.7 GiB each (about 52 GiB together); 18-44 s alone, of which 4-10 s
is Python start-up and imports with no GPU use; SM activity 0.16-0.82 alone. One job is submitted
without ``--mem``, one declaring half its peak. The numbers per job below are chosen inside those
ranges (the issue gives ranges, not a table): heavier transformers and CNNs, a light LSTM, and
MLPs at the bottom of the range, launch-bound as gpu-facts.md measured them; DRAM activity about
0.3-0.6 of SM activity. Nothing here was fitted to a result.

``python benchmarks/first_run_trace.py --job NAME [--lr LR] --out PATH`` runs one job as an
emulated training job (``collocate.node.emulate_job``: start-up, memory ramp, first steps, then
steady activity, its step reported every 0.25 s as a training loop logs it), so the daemon sees one script with
different arguments, as it did on the GPU:
the MLP sweep's points are one family (``collocate.core.identity``), ``--job lstm`` and ``--job mlp``
are not, and a resubmission with another ``--out`` is the same job.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class TraceJob:
    job: str
    lr: str
    gib: float  # peak memory
    sm: float  # solo SM activity
    dram: float  # solo DRAM activity
    seconds: float  # alone, start-up and first steps included
    startup_s: float  # interpreter, imports, model construction: no GPU use
    warmup_s: float  # first steps after start-up: memory held, almost no activity
    declare: str = "estimate"  # "estimate" (its peak x 1.02), "none", or "half"

    @property
    def name(self) -> str:
        return f"{self.job}-{self.lr}" if self.job in ("mlp", "gpt2-small") else self.job

    @property
    def peak_mib(self) -> float:
        return self.gib * 1024.0

    @property
    def declared_mib(self) -> float | None:
        return {"estimate": self.peak_mib * 1.02, "half": self.peak_mib / 2, "none": None}[self.declare]

    def argv(self, python: str, script: str, out: str) -> list[str]:
        return [python, script, "--job", self.job, "--lr", self.lr, "--out", out]


TRACE = (
    TraceJob("convnext-nano", "1e-3", 4.0, 0.55, 0.25, 30, 9, 2),
    TraceJob("efficientnet-b0", "1e-3", 4.5, 0.45, 0.22, 28, 9, 2),
    TraceJob("mobilenet-v3-large", "1e-3", 4.0, 0.35, 0.18, 25, 8, 2),
    TraceJob("resnet34", "0.1", 4.5, 0.82, 0.35, 30, 7, 2, declare="half"),
    TraceJob("bert-small", "1e-4", 3.5, 0.60, 0.20, 22, 10, 1),
    TraceJob("gpt2-small", "3e-4", 6.7, 0.70, 0.30, 35, 10, 1),
    TraceJob("gpt2-small", "1e-4", 6.7, 0.70, 0.30, 35, 10, 1),
    TraceJob("llama-8l", "3e-4", 6.5, 0.75, 0.35, 44, 10, 2),
    TraceJob("lstm", "1e-3", 3.0, 0.30, 0.15, 24, 5, 1, declare="none"),
    TraceJob("unet", "1e-3", 5.5, 0.65, 0.40, 30, 5, 2),
    TraceJob("mlp", "1e-2", 1.0, 0.18, 0.06, 18, 4, 1),
    TraceJob("mlp", "3e-3", 1.0, 0.16, 0.05, 18, 4, 1),
    TraceJob("mlp", "1e-3", 1.0, 0.20, 0.07, 18, 4, 1),
    TraceJob("mlp", "3e-4", 1.0, 0.17, 0.06, 18, 4, 1),
)
#: The 8 jobs the returning user submits again with new output paths (seeded draw, seed 29).
RETURNING = tuple(sorted(__import__("random").Random(29).sample(range(len(TRACE)), 8)))


def find(job: str, lr: str) -> TraceJob:
    for t in TRACE:
        if t.job == job and t.lr == lr:
            return t
    raise SystemExit(f"no job {job} --lr {lr} in the trace")


STEPS_PER_S = 10.0  # reported as a training loop logs its step (the GPU jobs every 5 steps)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="One emulated job of issue 29's first-run trace.")
    parser.add_argument("--job", required=True)
    parser.add_argument("--lr", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    t = find(args.job, args.lr)
    scale = float(os.environ.get("FIRST_RUN_SCALE", "1"))
    from collocate.gpus.emulated import state_dir_from_env
    from collocate.node.emulate_job import JobSpec, run_job

    spec = JobSpec(mem_mib=t.peak_mib, seconds=t.seconds * scale, sm=t.sm, dram=t.dram,
                   ramp_s=2.0 * scale, startup_s=t.startup_s * scale, warmup_s=t.warmup_s * scale,
                   steps_per_s=STEPS_PER_S / scale)
    return run_job(spec, state_dir_from_env(None), os.environ)


if __name__ == "__main__":
    sys.exit(main())
