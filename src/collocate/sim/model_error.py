"""What simulated GPUs do that the interference model does not predict (``--model-error``).

By default a simulated job runs at exactly the slowdown the interference model predicts, the
model ``auto`` scores its placements with. In simulation a policy that trusts the model is then
never wrong, and every margin it keeps against the model's error (``min_gain``) looks like pure
loss. With a model-error seed, each job in each mix runs at the model's slowdown times a factor
drawn from how wrong the model was on mixes it had not seen: the calibration's held-out
``log(measured / predicted)`` (``InterferenceModel.held_out_log_errors``: 73 jobs per mode on
the H100 bench, leave-one-mix-out; median error 5.6% time-sliced and 8.9% under MPS, at worst
+61% and -41%). A job never runs faster than alone.

The draw is fixed for a job and its set of co-runners on one GPU, so a mix keeps its speed while
it lasts and draws afresh when its members change. It is keyed by a stable hash of the seed and
the job ids, so a seed gives the same run bit for bit whatever ``PYTHONHASHSEED`` is. Policies,
their scores and the floors (``collocate.sim.floor``) still see the model alone; under model
error the model floor is an estimate, no longer a strict bound.

Not modelled: errors correlated across mixes (a workload the model misjudges in one mix is
likely misjudged in the next; here every mix draws afresh), so runs under different seeds
spread less than real runs would.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable
from dataclasses import dataclass

from collocate.common.errors import InputError
from collocate.core.interference import InterferenceModel
from collocate.core.model import SharingMode


@dataclass(frozen=True, slots=True)
class ModelError:
    seed: int
    log_errors: tuple[float, ...]

    @classmethod
    def of(cls, model: InterferenceModel, sharing: SharingMode, seed: int) -> ModelError:
        """The errors of ``sharing`` (on whole GPUs and MIG instances alike)."""
        errors = model.held_out_log_errors.get(sharing)
        if not errors:
            raise InputError(
                f"the interference model has no held-out errors for {sharing.value} to draw model error from",
                hint="use the packaged model, or a file written by `collocate bench calibrate` "
                     "(its [calibration.modes.*] cv_log_ratios), or drop --model-error",
            )
        return cls(seed, tuple(errors))

    def factor(self, job_id: str, co_runners: Iterable[str]) -> float:
        """The factor by which ``job_id`` runs slower than the model predicts beside these jobs."""
        key = "\x1f".join((str(self.seed), job_id, *sorted(co_runners))).encode()
        draw = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little")
        return math.exp(self.log_errors[draw % len(self.log_errors)])
