"""What is known of a job's solo activity before it runs: one rule for the daemon and simulator.

A new job's belief (``collocate.core.belief.Belief``; on the job as ``Job.profile``,
``profile_var`` and ``profile_source``) comes from, in order:

1. ``history``: what earlier runs of the same job taught (its identity,
   ``collocate.core.identity.JobKeys``: the same command up to seeds, output paths and run names;
   the simulator's ``Workload.command``), no surer than ``belief.HISTORY_SD_FLOOR``;
2. ``similar``: its family's (a sweep's other points: ``JobKeys.family``, the simulator's
   ``Workload.program``) ``FAMILY_RUNS`` most recently measured identities, their median
   shrunk toward the prior by how many agree (``belief.family_prior``);
3. else the prior (``belief.UNKNOWN``: ``assumed``).

While jobs run, a pending job that has no history of its own takes its family's prior over
history *and* the running siblings the world has observed (``price_pending``), so the first
point of a sweep measured on a GPU prices the other points within seconds.

When an attempt ends, what its readings taught (``learned_here``) goes into its history if it
succeeded, and into its next attempt if it was requeued (``carried_over``): both worlds apply
this one rule (``daemon/attempts.py``, ``sim/engine.py``).

The knowledge lives in a ``ProfileStore``: the daemon's SQLite ``Store`` (kept across restarts),
or ``MemoryProfiles`` (the simulator: one run's worth).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Protocol

from collocate.core.belief import UNKNOWN, Belief, as_history, family_prior
from collocate.core.model import Job, JobState

#: How many of a family's most recently measured identities its prior is the median of: the
#: prior is about the program as it runs now, not months ago, and the query stays bounded.
FAMILY_RUNS = 20
#: Belief sources taught by an attempt's own readings (alone: measured; shared: inferred), as
#: opposed to what it was told before it ran (the prior, its family, its history, a trace).
OBSERVED_HERE = ("measured", "inferred")


class ProfileStore(Protocol):
    def identity_belief(self, identity: str) -> Belief | None:
        """What earlier runs of this job taught, if any."""
        ...

    def family_beliefs(self, family: str, limit: int) -> dict[str, Belief]:
        """The beliefs of the family's ``limit`` most recently measured identities."""
        ...


class MemoryProfiles:
    """A ``ProfileStore`` in memory: identity → (family, belief), most recent last."""

    def __init__(self) -> None:
        self._by_identity: dict[str, tuple[str | None, Belief]] = {}

    def record(self, identity: str, family: str | None, belief: Belief) -> None:
        self._by_identity.pop(identity, None)  # re-inserted: now the most recent
        self._by_identity[identity] = (family, belief)

    def identity_belief(self, identity: str) -> Belief | None:
        known = self._by_identity.get(identity)
        return None if known is None else known[1]

    def family_beliefs(self, family: str, limit: int) -> dict[str, Belief]:
        recent = [(i, b) for i, (f, b) in reversed(self._by_identity.items()) if f == family]
        return dict(recent[:limit])


class ProfileKnowledge:
    """The "history, else the family's prior, else the prior" rule over a ``ProfileStore``."""

    def __init__(self, store: ProfileStore, *, recent: int = FAMILY_RUNS) -> None:
        self.store, self.recent = store, recent

    def known(self, identity: str | None, family: str | None, *, families: bool = True) -> Belief:
        """A new job's belief; ``families=False`` consults its own history only."""
        if identity is not None and (belief := self.store.identity_belief(identity)) is not None:
            return belief
        if families and family is not None:
            prior = family_prior(list(self.store.family_beliefs(family, self.recent).values()))
            if prior is not None:
                return prior
        return UNKNOWN

    def family_prior(self, family: str, live: Mapping[str, Belief]) -> Belief | None:
        """The family's prior over its history and ``live`` (identity → belief of running
        siblings the world has observed; they replace their own history)."""
        beliefs = {**self.store.family_beliefs(family, self.recent), **live}
        return family_prior(list(beliefs.values()))


def with_belief(job: Job, belief: Belief) -> Job:
    """The job told this belief of its profile."""
    return job.evolve(profile=belief.profile, profile_var=(belief.sm_var, belief.dram_var),
                      profile_source=belief.source)


def learned_here(belief: Belief) -> Belief | None:
    """What an ended attempt's readings taught of the job's activity; None when they taught
    nothing (its belief is still what it was told)."""
    return belief if belief.source in OBSERVED_HERE else None


def carried_over(job: Job, learned: Belief | None) -> Job | None:
    """The job after an attempt that ``learned`` its activity, when the job was requeued: its next
    attempt starts from what this one read (as history), not from what it was told at submission.
    None when nothing changes (it was not requeued, or nothing was learned)."""
    if learned is None or job.state is not JobState.PENDING:
        return None
    return with_belief(job, as_history(learned))


def price_pending(pending: Iterable[Job], live: Iterable[tuple[str | None, str | None, Belief]],
                  keys_of: Callable[[str], tuple[str | None, str | None]],
                  knowledge: ProfileKnowledge) -> list[Job]:
    """Pending jobs without history of their own, each told its family's prior over history and
    its observed running siblings (``live``: (identity, family, belief) of each); jobs whose
    family nobody runs are left out, and so are jobs whose prior did not change."""
    running: dict[str, dict[str, Belief]] = {}
    for identity, family, belief in live:
        if family is not None and identity is not None:
            running.setdefault(family, {})[identity] = belief
    if not running:
        return []
    priors: dict[str, Belief | None] = {}
    out = []
    for job in list(pending):
        if job.profile_source not in ("assumed", "similar"):
            continue
        identity, family = keys_of(job.id)
        if family is None or family not in running:
            continue
        if family not in priors:
            priors[family] = knowledge.family_prior(family, running[family])
        prior = priors[family]
        if prior is not None and (prior.profile != job.profile or job.profile_source != "similar"):
            out.append(with_belief(job, prior))
    return out
