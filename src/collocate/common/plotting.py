"""matplotlib, imported only where a plot is drawn: it is the optional ``plots`` extra, so the
daemon, the demo and the CLI install and start without it."""

from __future__ import annotations

from types import ModuleType

from collocate.common.errors import CollocateError


def pyplot() -> ModuleType:
    """``matplotlib.pyplot`` on the file-only Agg backend, or an error that says how to install it."""
    try:
        import matplotlib
    except ImportError:
        raise CollocateError("drawing plots needs matplotlib, which is not installed",
                             hint="pip install 'collocate[plots]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
