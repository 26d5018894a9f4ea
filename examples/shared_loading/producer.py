"""Run the input pipeline once for every collocated training job on this host.

    python producer.py                       # or: collocate share serve data:make_loader --name cifar-train

Stops on Ctrl-C / SIGTERM; consumers then fail with a clear ProducerLostError.
"""

from __future__ import annotations

from data import make_loader

from collocate import share

if __name__ == "__main__":
    share.serve(make_loader(), name="cifar-train")
