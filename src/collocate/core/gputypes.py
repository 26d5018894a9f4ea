"""GPU types the simulator and the emulated backend know, and the cluster-spec grammar.

Numbers are vendor datasheet figures (memory, SM count, board power limit); idle power is an
assumption awaiting measurement (see ``data/interference.toml`` for the power model).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from collocate.common.errors import InputError, UnknownNameError


@dataclass(frozen=True, slots=True)
class GpuType:
    name: str
    memory_mib: int  # what CUDA/NVML report as total (slightly under the marketing size)
    sm_count: int
    idle_watts: float
    max_watts: float
    compute_capability: int  # 80 = sm_80; the estimator's workspace sizes depend on it


GPU_TYPES: dict[str, GpuType] = {
    t.name: t
    for t in (
        GpuType("A100-40GB", 40_536, 108, 55.0, 400.0, 80),
        GpuType("A100-80GB", 81_920, 108, 60.0, 400.0, 80),
        GpuType("H100-80GB", 81_559, 132, 70.0, 700.0, 90),
        GpuType("H200-141GB", 143_771, 132, 75.0, 700.0, 90),
        GpuType("L4-24GB", 23_034, 58, 16.0, 72.0, 89),
        GpuType("RTX4090-24GB", 24_564, 128, 20.0, 450.0, 89),
        GpuType("V100-32GB", 32_510, 80, 40.0, 300.0, 70),
    )
}


def gpu_type(name: str) -> GpuType:
    """Look a type up by name (case-insensitive); the error lists the known ones."""
    found = GPU_TYPES.get(name) or next((t for k, t in GPU_TYPES.items() if k.lower() == name.lower()), None)
    if found is None:
        raise UnknownNameError("GPU type", name, list(GPU_TYPES))
    return found


_PRODUCTS: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(p, re.IGNORECASE), name)
    for p, name in (
        (r"\bA100\b.*\b80\s?GB\b", "A100-80GB"),
        (r"\bA100\b.*\b40\s?GB\b", "A100-40GB"),
        (r"\bH100\b.*\b80\s?GB\b.*\bHBM3\b", "H100-80GB"),  # SXM5; PCIe/NVL parts differ
        (r"\bH200\b", "H200-141GB"),
        (r"\bL4\b", "L4-24GB"),
        (r"\bRTX\s?4090\b", "RTX4090-24GB"),
        (r"\bV100\b.*\b32\s?GB\b", "V100-32GB"),
    )
)


def type_name_from_product(product: str) -> str:
    """Our GPU type name for an NVML product name, or the product name itself when unknown.

    "NVIDIA H100 80GB HBM3" -> "H100-80GB"; "NVIDIA A100-SXM4-40GB" -> "A100-40GB". A MIG device
    name ("NVIDIA A100-SXM4-40GB MIG 3g.20gb") maps to its parent's type.
    """
    base = re.split(r"\s+MIG\s+", product, maxsplit=1)[0]
    for pattern, name in _PRODUCTS:
        if pattern.search(base):
            return name
    return base.strip()


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
