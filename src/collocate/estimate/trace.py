"""Trace one full training iteration and record every tensor storage's birth and death.

Why this way: PyTorch's ``FakeTensorMode`` runs every ATen operator for shapes and dtypes only,
so a whole forward/loss/backward/optimizer step of a ResNet-50 costs about a second of CPU and
no real memory. A ``TorchDispatchMode`` stacked on top sees every operator's outputs; each new
storage is an allocation, and a weak reference on it tells us when autograd or Python drops it.
The resulting timeline is what the CUDA caching allocator would see, and ``allocator.replay``
turns it into reserved memory.

The same tracker works on real CPU tensors, which is how the ``cpu-run`` fallback measures
models that fake mode cannot run (data-dependent operators such as ``.item()``).

Fake CUDA tensors abort on CPU-only builds, so we trace on fake *CPU* tensors. Three CPU/GPU
differences are compensated: optimizers are forced to their ``foreach`` implementation (the
CUDA default, which allocates per-step temporaries); AMP uses CPU autocast with the same
dtype, whose cast lists are close to, but not identical with, CUDA's; and attention and
dropout run the GPU's fused kernels (``fused.py``, applied by ``static.trace_fake``).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from collocate.estimate.allocator import Alloc, Event, Free

CONV_OPS = ("aten.convolution.default", "aten.convolution_backward.default")


@dataclass
class Trace:
    """A recorded timeline plus what each storage turned out to be."""

    events: list[Event]
    sizes: dict[int, int]
    markers: dict[str, int]  # phase name -> number of events recorded before it began
    categories: dict[int, str] = field(default_factory=dict)  # key -> parameters/gradients/...
    largest_conv_bytes: int = 0
    conv_ops: int = 0
    construction: str = "fake"  # "fake": built under FakeTensorMode; "converted": built real


def make_tracker() -> Any:
    """Create a storage tracker (a ``TorchDispatchMode``); imported lazily to keep torch optional."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten
    from torch.utils.weak import WeakIdKeyDictionary

    class StorageTracker(TorchDispatchMode):
        """Records Alloc/Free events for every storage created while active."""

        def __init__(self) -> None:
            super().__init__()
            self.events: list[Event] = []
            self.sizes: dict[int, int] = {}
            self.markers: dict[str, int] = {}
            self._keys: Any = WeakIdKeyDictionary()
            self._next = 0
            self.largest_conv_bytes = 0
            self.conv_ops = 0

        def key_of(self, t: torch.Tensor) -> int | None:
            return self._keys.get(t.untyped_storage())

        def adopt(self, t: torch.Tensor) -> None:
            """Record ``t``'s storage as allocated now (tensors made outside the mode)."""
            st = t.untyped_storage()
            if st in self._keys:
                return
            key = self._next
            self._next += 1
            self._keys[st] = key
            nbytes = int(st.nbytes())
            if nbytes == 0:
                return  # CUDA's allocator hands out no memory for empty tensors
            self.sizes[key] = nbytes
            self.events.append(Alloc(key, nbytes))
            weakref.finalize(st, self.events.append, Free(key))

        def mark(self, name: str) -> None:
            self.markers[name] = len(self.events)

        def __torch_dispatch__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            out = func(*args, **(kwargs or {}))
            flat = tree_flatten(out)[0]
            for t in flat:
                if isinstance(t, torch.Tensor) and t.device.type != "meta":
                    self.adopt(t)
            name = str(func)
            if name in CONV_OPS:
                self.conv_ops += 1
                for t in flat:
                    if isinstance(t, torch.Tensor):
                        self.largest_conv_bytes = max(
                            self.largest_conv_bytes, t.numel() * t.element_size()
                        )
            return out

    return StorageTracker()


def as_args(inputs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Positional and keyword arguments for ``model(...)`` from the entry point's inputs."""
    if isinstance(inputs, dict):
        return (), dict(inputs)
    if isinstance(inputs, tuple | list):
        return tuple(inputs), {}
    return (inputs,), {}


def primary_output(out: Any) -> Any:
    """The tensor a loss is computed from: ``.loss``/``.logits`` of HF outputs, first of tuples."""
    import torch

    for attr in ("loss", "logits", "last_hidden_state"):
        val = getattr(out, attr, None)
        if isinstance(val, torch.Tensor):
            return val
    if isinstance(out, dict):
        for v in out.values():
            if isinstance(v, torch.Tensor):
                return v
    if isinstance(out, tuple | list):
        return primary_output(out[0])
    return out


def default_loss(output: Any, targets: Any) -> Any:
    """The loss of an entry point that returns none (issue #4's default): cross-entropy for
    integer targets, with the classes on the last dimension (classifiers, language models) or on
    dimension 1 as ``F.cross_entropy`` takes them (dense prediction: (N, C, H, W) logits and (N,
    H, W) targets); mean squared error against same-sized float targets."""
    import torch
    import torch.nn.functional as F

    if getattr(output, "loss", None) is not None and isinstance(output.loss, torch.Tensor):
        return output.loss
    out = primary_output(output)
    if targets is None:
        return out.float().pow(2).mean()
    if not targets.is_floating_point():
        if out.dim() >= 2 and targets.shape == out.shape[:-1]:
            return F.cross_entropy(out.reshape(-1, out.shape[-1]).float(), targets.reshape(-1))
        if out.dim() >= 2 and targets.shape == (out.shape[0], *out.shape[2:]):
            return F.cross_entropy(out.float(), targets)
        raise _no_default_loss(out, targets, "integer class targets of shape (N, ...) for "
                               "logits with the classes last or on dimension 1")
    if targets.numel() != out.numel():
        raise _no_default_loss(out, targets, "float targets with as many elements as the output")
    return F.mse_loss(out.float(), targets.float().reshape(out.shape))


def _no_default_loss(out: Any, targets: Any, expected: str) -> Exception:
    from collocate.common.errors import InputError

    return InputError(
        f"no default loss for an output of shape {tuple(out.shape)} and targets of shape "
        f"{tuple(targets.shape)} (the default expects {expected})",
        hint="return the loss you train with as the entry point's fourth item: "
        "(model, batch, optimizer, loss_fn), loss_fn(output, targets) -> scalar tensor",
    )


def prefer_foreach(optimizer: Any) -> None:
    """Use the multi-tensor (``foreach``) optimizer path, PyTorch's default on CUDA."""
    for group in optimizer.param_groups:
        if "foreach" in group and group.get("foreach") is None and not group.get("fused"):
            group["foreach"] = True


@contextlib.contextmanager
def autocast_for(precision: str) -> Iterator[None]:
    """CPU autocast standing in for CUDA AMP; fp32 is a no-op."""
    import torch

    if precision == "fp32":
        yield
        return
    dtype = torch.float16 if precision == "fp16" else torch.bfloat16
    with torch.autocast("cpu", dtype=dtype):
        yield


def warm_optimizer(optimizer: Any) -> None:
    """Create the optimizer's state with one zero-gradient step, so the traced iteration is a
    steady-state one (state alive during forward and backward, as from iteration 2 on)."""
    import torch

    with torch.no_grad():
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.requires_grad:
                    p.grad = torch.zeros_like(p)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def training_step(
    work: Any, precision: str, tracker: Any, loss_default: Callable[..., Any] = default_loss
) -> Any:
    """One iteration: zero_grad, forward, loss, backward, optimizer step, with phase markers.

    Returns the loss so that callers keep the same references a training loop would.
    """
    work.model.train()
    prefer_foreach(work.optimizer)
    tracker.mark("warmup")
    warm_optimizer(work.optimizer)
    tracker.mark("forward")
    args, kwargs = as_args(work.inputs)
    with autocast_for(precision):
        out = work.model(*args, **kwargs)
        if work.loss_fn is None:
            loss = loss_default(out, work.targets)
        elif work.targets is None:
            loss = work.loss_fn(out)
        else:
            loss = work.loss_fn(out, work.targets)
    if not hasattr(loss, "backward"):
        from collocate.common.errors import InputError

        raise InputError(
            f"the loss function returned {type(loss).__name__}, not a tensor",
            hint="return a scalar tensor from the loss function",
        )
    if loss.numel() != 1:
        loss = loss.mean()
    tracker.mark("backward")
    loss.backward()
    tracker.mark("step")
    work.optimizer.step()
    tracker.mark("end")
    return loss


def categorise(work: Any, tracker: Any) -> dict[int, str]:
    """Label storages alive at the end as parameters, gradients or optimizer state."""
    import torch

    cats: dict[int, str] = {}

    def put(t: Any, cat: str) -> None:
        if isinstance(t, torch.Tensor):
            k = tracker.key_of(t)
            if k is not None and k not in cats:
                cats[k] = cat

    for p in work.model.parameters():
        put(p, "parameters")
    for b in work.model.buffers():
        put(b, "parameters")
    for p in work.model.parameters():
        put(p.grad, "gradients")
    for state in work.optimizer.state.values():
        for v in state.values():
            put(v, "optimizer_state")
    return cats


def finish(tracker: Any, work: Any, construction: str) -> Trace:
    """Package the tracker's timeline once the step has run."""
    return Trace(
        events=list(tracker.events),
        sizes=dict(tracker.sizes),
        markers=dict(tracker.markers),
        categories=categorise(work, tracker),
        largest_conv_bytes=tracker.largest_conv_bytes,
        conv_ops=tracker.conv_ops,
        construction=construction,
    )
