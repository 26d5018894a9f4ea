"""GPU types the simulator and the emulated backend know, and the cluster-spec grammar.

Numbers are vendor datasheet figures (memory, SM count, board power limit); idle power is an
assumption awaiting measurement (see ``data/interference.toml`` for the power model).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from collocate.errors import InputError, UnknownNameError


@dataclass(frozen=True, slots=True)
class GpuType:
    name: str
    memory_mib: int
    sm_count: int
    idle_watts: float
    max_watts: float


# memory_mib is what CUDA reports as total (slightly under the marketing size).
GPU_TYPES: dict[str, GpuType] = {
    t.name: t
    for t in (
        GpuType("A100-40GB", 40_536, 108, 55.0, 400.0),
        GpuType("A100-80GB", 81_920, 108, 60.0, 400.0),
        GpuType("H100-80GB", 81_559, 132, 70.0, 700.0),
        GpuType("H200-141GB", 143_771, 132, 75.0, 700.0),
        GpuType("L4-24GB", 23_034, 58, 16.0, 72.0),
        GpuType("RTX4090-24GB", 24_564, 128, 20.0, 450.0),
    )
}


def gpu_type(name: str) -> GpuType:
    try:
        return GPU_TYPES[name]
    except KeyError:
        raise UnknownNameError("GPU type", name, list(GPU_TYPES)) from None


@dataclass(frozen=True, slots=True)
class NodeSpec:
    name: str
    gpu_type: GpuType
    count: int


_SIMPLE = re.compile(r"^\s*(\d+)\s*x\s*([A-Za-z0-9\-]+)\s*$")
_NODES = re.compile(r"^\s*(\d+)\s*x\s*\(\s*(\d+)\s*x\s*([A-Za-z0-9\-]+)\s*\)\s*$")


def parse_cluster(spec: str) -> tuple[NodeSpec, ...]:
    """Parse ``4xA100-40GB`` (one node) or ``2x(8xH100-80GB)`` (nodes of GPUs); ``+`` joins parts.

    >>> [(n.name, n.count) for n in parse_cluster("2x(2xA100-40GB)+1xH100-80GB")]
    [('node0', 2), ('node1', 2), ('node2', 1)]
    """
    nodes: list[NodeSpec] = []
    for part in spec.split("+"):
        if m := _NODES.match(part):
            n_nodes, per_node, type_name = int(m[1]), int(m[2]), m[3]
        elif m := _SIMPLE.match(part):
            n_nodes, per_node, type_name = 1, int(m[1]), m[2]
        else:
            raise InputError(
                f"cannot read cluster spec {spec!r} (part {part!r})",
                hint="write it like 4xA100-40GB, or 2x(8xH100-80GB) for 2 nodes of 8 GPUs; "
                "join different nodes with +",
            )
        if n_nodes < 1 or per_node < 1:
            raise InputError(f"cluster spec {spec!r} asks for zero GPUs", hint="use counts >= 1")
        kind = gpu_type(type_name)
        for _ in range(n_nodes):
            nodes.append(NodeSpec(f"node{len(nodes)}", kind, per_node))
    return tuple(nodes)
