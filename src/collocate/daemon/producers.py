"""The head's rules for shared datasets: which factory serves a dataset name, and what a node is
asked to start (the producers themselves run on the jobs' nodes: ``node/datasets.py``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from collocate.common.errors import InputError
from collocate.core.model import Job
from collocate.node.datasets import ProducerRequest
from collocate.wire.spec import JobSpec


def producer_request(spec: JobSpec) -> ProducerRequest:
    """What the node of a ``--dataset`` job needs to start its producer."""
    assert spec.dataset is not None
    return ProducerRequest(spec.dataset, spec.dataset_factory, spec.cwd, dict(spec.env),
                           spec.uid, spec.gid)


def active_factories(jobs: Iterable[Job], specs: Mapping[str, JobSpec]) -> dict[str, str]:
    """``dataset -> factory`` of the datasets that pending or running jobs use."""
    out: dict[str, str] = {}
    for job in jobs:
        spec = specs.get(job.id)
        if spec is not None and spec.dataset and not job.state.is_terminal and spec.dataset_factory:
            out.setdefault(spec.dataset, spec.dataset_factory)
    return out


def resolve_factory(spec: JobSpec, jobs: Iterable[Job], specs: Mapping[str, JobSpec]) -> str:
    """The factory ``spec``'s dataset is served with; raises ``InputError`` when it is missing
    (first job of the name) or differs from the one the dataset's active jobs use.

    Remembered per name: the active jobs' factory first, else the most recent job's."""
    assert spec.dataset is not None
    jobs = list(jobs)
    active = active_factories(jobs, specs).get(spec.dataset)
    if spec.dataset_factory is not None:
        if active is not None and active != spec.dataset_factory:
            raise InputError(
                f"dataset {spec.dataset!r} is already served by {active}, not {spec.dataset_factory}",
                hint=f"drop --dataset-factory (or pass {active}), or use another --dataset name")
        return spec.dataset_factory
    if active is not None:
        return active
    for job in reversed(jobs):
        earlier = specs.get(job.id)
        if earlier is not None and earlier.dataset == spec.dataset and earlier.dataset_factory:
            return earlier.dataset_factory
    raise InputError(f"dataset {spec.dataset!r} is new to this daemon, so it needs a factory",
                     hint="add --dataset-factory module:factory (a function returning the "
                          "DataLoader to share, as `collocate share serve` takes)")
