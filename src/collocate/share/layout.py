"""Batch layout: how a (tensor | tuple | list | dict of tensors) batch maps onto a ring slot.

The producer derives the layout from its first batch and sends it to consumers once, as JSON, so
later messages only say *which* slot holds *how many* samples. Every later batch is checked
against it: same structure, dtypes and per-sample shapes, and no more samples than the first
(slots are preallocated from it). Anything else is a ``LayoutError`` that says what differed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from collocate.share.errors import LayoutError

ALIGN = 64
HEADER_BYTES = 64  # per slot: the sequence number written last, checked by consumers
PAGE = 4096

_DTYPES: dict[str, torch.dtype] = {
    str(dt).removeprefix("torch."): dt
    for dt in (
        torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64,
        torch.complex128, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
        torch.bool,
    )
}


def _align(n: int, to: int = ALIGN) -> int:
    return (n + to - 1) // to * to


@dataclass(frozen=True)
class Field:
    """One tensor of the batch: its key, dtype, per-sample shape and place inside a slot."""

    key: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    sample_bytes: int

    @property
    def torch_dtype(self) -> torch.dtype:
        return _DTYPES[self.dtype]


@dataclass(frozen=True)
class Layout:
    """The slot format shared by a producer and all its consumers."""

    kind: str  # "tensor" | "tuple" | "list" | "dict"
    fields: tuple[Field, ...]
    capacity: int  # samples per slot (the first batch's size)
    slot_bytes: int  # page-aligned, header included

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "capacity": self.capacity,
            "slot_bytes": self.slot_bytes,
            "fields": [
                {"key": f.key, "dtype": f.dtype, "shape": list(f.shape), "offset": f.offset,
                 "sample_bytes": f.sample_bytes}
                for f in self.fields
            ],
        }

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Layout:
        """Rebuild and sanity-check a layout received from a producer."""
        from collocate.share.errors import ProtocolError

        try:
            fields = tuple(
                Field(str(f["key"]), str(f["dtype"]), tuple(int(s) for s in f["shape"]),
                      int(f["offset"]), int(f["sample_bytes"]))
                for f in obj["fields"]
            )
            layout = cls(str(obj["kind"]), fields, int(obj["capacity"]), int(obj["slot_bytes"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise ProtocolError(f"malformed layout from producer: {exc}") from None
        if layout.kind not in ("tensor", "tuple", "list", "dict") or not fields:
            raise ProtocolError(f"malformed layout kind {layout.kind!r}")
        for f in fields:
            if f.dtype not in _DTYPES or f.offset + f.sample_bytes * layout.capacity > layout.slot_bytes:
                raise ProtocolError(f"layout field {f.key!r} does not fit its slot")
        return layout

    def flatten(self, batch: Any, index: int) -> tuple[list[torch.Tensor], int]:
        """The batch's tensors in field order and its sample count, after checking it fits."""
        kind, items = _items(batch)
        keys = [k for k, _ in items]
        if kind != self.kind or keys != [f.key for f in self.fields]:
            raise LayoutError(
                f"batch {index} is a {kind} with keys {keys}, but the first batch was a "
                f"{self.kind} with keys {[f.key for f in self.fields]}",
                hint="every batch must have the same structure; fix the loader's collate_fn",
            )
        tensors = [t for _, t in items]
        count = _batch_len(tensors, index)
        if count > self.capacity:
            raise LayoutError(
                f"batch {index} has {count} samples but slots hold {self.capacity} (the first batch's size)",
                hint="make the first batch the largest (e.g. a fixed batch_size) or pass capacity= to serve()",
            )
        for f, t in zip(self.fields, tensors, strict=True):
            if _dtype_name(t) != f.dtype or tuple(t.shape[1:]) != f.shape:
                raise LayoutError(
                    f"batch {index} field {f.key!r} is {_dtype_name(t)}{list(t.shape[1:])} per sample, "
                    f"the first batch had {f.dtype}{list(f.shape)}",
                    hint="pad or resize samples to one shape in the loader (shared slots are fixed-size)",
                )
        return tensors, count

    def empty(self, rows: int, device: torch.device | str = "cpu") -> list[torch.Tensor]:
        """Uninitialised private tensors for ``rows`` samples, one per field: where copies go."""
        return [torch.empty((rows, *f.shape), dtype=f.torch_dtype, device=device) for f in self.fields]

    def unflatten(self, tensors: list[torch.Tensor]) -> Any:
        """Rebuild the producer's batch structure from per-field tensors."""
        if self.kind == "tensor":
            return tensors[0]
        if self.kind == "dict":
            return {f.key: t for f, t in zip(self.fields, tensors, strict=True)}
        return tuple(tensors) if self.kind == "tuple" else list(tensors)


def layout_for(batch: Any, capacity: int | None = None) -> Layout:
    """Derive the slot layout from the first batch (``capacity`` overrides its size)."""
    kind, items = _items(batch)
    count = _batch_len([t for _, t in items], 0)
    cap = max(count, capacity or 0)
    fields: list[Field] = []
    offset = HEADER_BYTES
    for key, t in items:
        name = _dtype_name(t)
        if name not in _DTYPES:
            raise LayoutError(f"field {key!r} has unsupported dtype {t.dtype}",
                              hint=f"convert it to one of {', '.join(sorted(_DTYPES))}")
        sample_bytes = t[0].numel() * t.element_size() if count else 0
        fields.append(Field(key, name, tuple(t.shape[1:]), offset, sample_bytes))
        offset = _align(offset + sample_bytes * cap)
    return Layout(kind, tuple(fields), cap, _align(offset, PAGE))


def _dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def _items(batch: Any) -> tuple[str, list[tuple[str, torch.Tensor]]]:
    if isinstance(batch, torch.Tensor):
        items, kind = [("0", batch)], "tensor"
    elif isinstance(batch, dict):
        items, kind = [(str(k), v) for k, v in batch.items()], "dict"
        if any(not isinstance(k, str) for k in batch):
            raise LayoutError("dict batches need string keys", hint="use string keys in collate_fn")
    elif isinstance(batch, (tuple, list)):
        items = [(str(i), v) for i, v in enumerate(batch)]
        kind = "tuple" if isinstance(batch, tuple) else "list"
    else:
        raise LayoutError(
            f"cannot share a batch of type {type(batch).__name__}",
            hint="yield a tensor, or a tuple/list/dict of tensors (one level, batch dimension first)",
        )
    for key, value in items:
        if not isinstance(value, torch.Tensor):
            raise LayoutError(
                f"field {key!r} is a {type(value).__name__}, not a tensor",
                hint="only tensors can be shared; convert it in collate_fn or drop it",
            )
        if value.dim() == 0:
            raise LayoutError(f"field {key!r} is a 0-d tensor without a batch dimension",
                              hint="give every field a leading batch dimension")
    if not items:
        raise LayoutError("empty batch structure", hint="yield at least one tensor per batch")
    return kind, items


def _batch_len(tensors: list[torch.Tensor], index: int) -> int:
    sizes = {int(t.shape[0]) for t in tensors}
    if len(sizes) != 1:
        raise LayoutError(f"batch {index} fields disagree on the batch size: {sorted(sizes)}",
                          hint="every tensor of a batch needs the same first dimension")
    return sizes.pop()
