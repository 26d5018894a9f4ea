"""A torchrun worker for round E2: one all-reduce, NCCL on a GPU (gloo on a CPU rehearsal).

    torchrun --nproc-per-node N torchrun_allreduce.py [--backend nccl|gloo]

Each rank contributes rank + 1; every rank prints what the all-reduce gave, the world size and
the node rank collocate set (``NODE_RANK``, absent for a job on one node), on a line of its own.
"""

import argparse
import os

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--backend", default="nccl")
backend = parser.parse_args().backend
dist.init_process_group(backend)
rank = dist.get_rank()
device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if backend == "nccl" else torch.device("cpu")
if backend == "nccl":
    torch.cuda.set_device(device)
value = torch.tensor([float(rank + 1)], device=device)
dist.all_reduce(value)
print(f"all_reduce {value.item():g} world {dist.get_world_size()} backend {backend} "
      f"node_rank {os.environ.get('NODE_RANK', '-')} device {device}", flush=True)
dist.destroy_process_group()
