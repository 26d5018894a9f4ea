"""A job of a shared dataset: read one epoch from the daemon's producer, check it, exit 0.

It names nothing itself: the dataset comes from ``COLLOCATE_DATASET`` and ``SharedLoader``
finds the daemon's producers through ``COLLOCATE_SHARE_DIR``, as a real training script would.
Usage: python dataset_job.py EXPECTED_SAMPLES [SLEEP_S]   (sleeps before reading: restart tests)
"""

import os
import sys
import time

from collocate.share import SharedLoader

expected = int(sys.argv[1])
time.sleep(float(sys.argv[2]) if len(sys.argv) > 2 else 0.0)
with SharedLoader(os.environ["COLLOCATE_DATASET"], connect_timeout=20) as loader:
    ids = []
    for batch in loader:
        assert (batch["x"][:, 0] == batch["id"].float()).all()
        ids += batch["id"].tolist()
print(f"consumed {len(ids)} samples", flush=True)
sys.exit(0 if sorted(ids) == list(range(expected)) else 1)
