"""Shared data loading: one producer runs the input pipeline once, many training jobs consume it.

``serve(loader, name=...)`` publishes every batch of any DataLoader (or iterable of tensors,
tuples/lists/dicts of tensors) into a shared-memory ring; ``SharedLoader(name, batch_size=...)``
iterates them like a DataLoader from any process of the same user on the same host.
See docs/shared-loading.md for the design, protocol and guarantees.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from collocate.share.errors import (
    ConsumerDetachedError,
    LayoutError,
    ProducerExistsError,
    ProducerLostError,
    ProducerNotFoundError,
    ShareError,
)

if TYPE_CHECKING:
    from collocate.share.consumer import SharedLoader
    from collocate.share.producer import Producer, serve

__all__ = [
    "ConsumerDetachedError",
    "LayoutError",
    "Producer",
    "ProducerExistsError",
    "ProducerLostError",
    "ProducerNotFoundError",
    "ShareError",
    "SharedLoader",
    "serve",
]


def __getattr__(name: str) -> Any:
    """Import torch-dependent parts lazily so ``collocate --help`` and the daemon stay light."""
    if name == "SharedLoader":
        from collocate.share.consumer import SharedLoader

        return SharedLoader
    if name in ("serve", "Producer"):
        from collocate.share import producer

        return getattr(producer, name)
    raise AttributeError(f"module 'collocate.share' has no attribute {name!r}")
