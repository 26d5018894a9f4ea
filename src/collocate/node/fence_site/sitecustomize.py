"""Caps a PyTorch job's caching allocator at the memory its attempt committed (collocate).

The collocate runner puts this directory first on a fenced job's PYTHONPATH, with the cap in
MiB in COLLOCATE_MEM_FENCE_MIB. It never imports torch: an import hook waits for the job's own
``import torch`` and then queues ``torch.cuda.set_per_process_memory_fraction`` for each device
with ``torch.cuda._lazy_call``, so the cap is set when CUDA initialises, not before. An
allocation past the cap raises ``torch.OutOfMemoryError`` in this process only. Any
``sitecustomize`` the job had further on its path still runs.
"""

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys

_ENV = "COLLOCATE_MEM_FENCE_MIB"
_HERE = os.path.dirname(os.path.abspath(__file__))


def _chain():
    """Run the next ``sitecustomize`` on the path, as if this one were not there."""
    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


def fence(torch, mib):
    """Cap every visible device's caching allocator at ``mib`` once CUDA initialises."""
    cuda = torch.cuda

    def cap():
        for i in range(cuda.device_count()):
            total = cuda.get_device_properties(i).total_memory
            cuda.set_per_process_memory_fraction(min(1.0, mib * 1048576.0 / total), i)

    cap.collocate_fence_mib = mib
    if cuda.is_initialized():
        cap()
    elif hasattr(cuda, "_lazy_call"):
        cuda._lazy_call(cap)


class _TorchHook(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the loader of ``torch`` so the fence follows its import."""

    def __init__(self, mib):
        self.mib = mib

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        sys.meta_path.remove(self)  # once, and never for its own look-up below
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader, mib = spec.loader, self.mib
        run = loader.exec_module

        def exec_module(module):
            run(module)
            try:
                fence(module, mib)
            except Exception as exc:  # never break the job for its fence
                print(f"collocate: could not fence GPU memory at {mib:.0f} MiB: {exc}", file=sys.stderr)

        loader.exec_module = exec_module
        return spec


def _install():
    try:
        mib = float(os.environ.get(_ENV, ""))
    except ValueError:
        return
    if mib <= 0:
        return
    if "torch" in sys.modules:  # imported already (cannot happen at start-up; kept safe)
        fence(sys.modules["torch"], mib)
    else:
        sys.meta_path.insert(0, _TorchHook(mib))


_install()
_chain()
