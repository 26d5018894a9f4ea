"""A real PyTorch training job for round F1 (``fence_freeze_gpu.py``): it holds GPU memory as
told, grows at a point of its progress, trains a small model deterministically, and writes its
final loss.

    python fence_freeze_job.py --hold-mib 40000 --grow-mib 60000 --grow-at 0.5 --steps 400 \
        --out loss.json [--progress progress.txt]

* memory: ``--hold-mib`` from the first step (one block through PyTorch's caching allocator, as a
  model's weights and activations would be), ``--grow-mib`` in all from ``--grow-at`` of the steps
  on (the late peak of issue 35). A job collocate fenced gets ``torch.OutOfMemoryError`` from its
  capped allocator when it grows past its commitment, in its own process only;
* training: an MLP on synthetic data from ``--seed``, deterministic algorithms, so a run that was
  frozen and thawed ends with the same loss bit for bit as one that was not;
* ``--grow-gate``: at ``--grow-at`` it waits for this file before growing, so the harness orders
  one job's growth after a neighbour's on any machine;
* ``--progress``: the step count, rewritten every step, so the harness sees a frozen job stand still;
* steps are reported with ``collocate.monitor.log_metric`` under the daemon (its slowdown watch).

Without CUDA (the CPU rehearsal) it trains on the CPU and holds its memory on the emulated GPU the
daemon gave it, honouring the fence as the capped allocator would (``COLLOCATE_MEM_FENCE_MIB``).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import torch

MIB = 1 << 20


class Memory:
    """What the job holds: real CUDA blocks, or a claim on its emulated GPU (CPU rehearsal)."""

    def __init__(self, device: torch.device) -> None:
        self.device, self.blocks, self.held = device, [], 0.0
        self._emulated: Callable[[float], None] | None = None if device.type == "cuda" else _emulated_holder()

    def hold(self, mib: float) -> None:
        """Hold ``mib`` in all (more than now: allocate the difference)."""
        if mib <= self.held:
            return
        if self._emulated is not None:
            self._emulated(mib)
        else:
            self.blocks.append(torch.empty(int((mib - self.held) * MIB), dtype=torch.uint8, device=self.device))
        self.held = mib


def _emulated_holder() -> Callable[[float], None] | None:
    """The emulated GPU's claim for this process, with the fence a capped allocator would set;
    None outside the daemon (nothing to hold)."""
    if not os.environ.get("CUDA_VISIBLE_DEVICES"):
        return None
    from collocate.gpus.emulated import state_dir_from_env
    from collocate.gpus.emulated_state import Refusal, StateStore, process_start_time
    from collocate.node.emulate_job import oom_message, resolve_devices
    from collocate.node.fence import fence_of

    store = StateStore.open_existing(state_dir_from_env())
    pid, fence = os.getpid(), fence_of(os.environ)
    devices = resolve_devices(os.environ.get("CUDA_VISIBLE_DEVICES"), store.devices())

    def claim(mib: float) -> None:
        for ordinal, dev in enumerate(devices):
            if fence is not None and mib > fence:
                refusal = Refusal(dev.uuid, requested_mib=mib - fence, total_mib=fence, free_mib=0.0, own_mib=fence, others=())
            else:
                refusal = store.claim(dev.uuid, pid, process_start_time(pid) or 0.0, mib, 0.5, 0.2)
            if refusal is not None:
                store.release(pid)
                raise SystemExit(oom_message(refusal, ordinal, pid))

    return claim


def step_reporter() -> Callable[[int], None]:
    if not os.environ.get("COLLOCATE_METRICS_FILE"):
        return lambda n: None
    from collocate.monitor import log_metric

    return lambda n: None if n % 5 else log_metric("step", n, step=n)


def train(args: argparse.Namespace) -> dict[str, object]:
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS, before CUDA starts
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True)
    memory = Memory(device)
    memory.hold(args.hold_mib)
    width = 1024 if device.type == "cuda" else 64
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, 1)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(256, width, device=device)
    y = torch.randn(256, 1, device=device)
    report = step_reporter()
    grow_step = int(args.steps * args.grow_at) if args.grow_mib else None
    loss = torch.zeros((), device=device)
    t0 = time.monotonic()
    for n in range(1, args.steps + 1):
        if grow_step is not None and n == grow_step:
            while args.grow_gate and not Path(args.grow_gate).exists():  # the harness says when
                time.sleep(0.1)
            memory.hold(args.grow_mib)
        for _ in range(args.inner):
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        if args.step_sleep:
            time.sleep(args.step_sleep)
        report(n)
        if args.progress:
            Path(args.progress).write_text(f"{n}\n")
    value = float(loss.item())
    return {"loss": value, "loss_hex": value.hex(), "steps": args.steps, "train_s": round(time.monotonic() - t0, 2),
            "held_mib": memory.held, "device": device.type,
            "reserved_peak_mib": torch.cuda.max_memory_reserved() / MIB if device.type == "cuda" else None}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hold-mib", type=float, required=True)
    p.add_argument("--grow-mib", type=float, default=0.0, help="memory in all from --grow-at on (0: no growth)")
    p.add_argument("--grow-at", type=float, default=0.5)
    p.add_argument("--grow-gate", default="", help="at --grow-at, wait for this file to exist before growing")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--inner", type=int, default=20, help="optimizer steps per reported step")
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds after each step (CPU rehearsal pacing)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)
    p.add_argument("--progress", default="")
    args = p.parse_args()
    result = train(args)
    Path(args.out).write_text(json.dumps(result))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
