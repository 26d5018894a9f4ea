"""The provider chain: history overrides static, errors never escape, --mem is the last word."""

from __future__ import annotations

import math

import pytest

from collocate.common.errors import InputError
from collocate.estimate.base import Estimate
from collocate.estimate.providers import (
    ChainProvider,
    DeclaredProvider,
    EstimateProvider,
    EstimateRequest,
    HistoryProvider,
    StaticProvider,
    default_chain,
    job_signature,
)

SIG = job_signature("_entries:tiny_mlp", 16)
REQ = EstimateRequest(signature=SIG, entry_point="_entries:tiny_mlp", batch_size=16,
                      declared_mib=9000.0)


class Boom:
    name = "boom"

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def estimate(self, request: EstimateRequest) -> Estimate | None:
        raise self.exc


def test_history_overrides_static() -> None:
    chain = default_chain({SIG: 1234.0}.get, isolated=False)
    est = chain.estimate(REQ)
    assert (est.method, est.mib) == ("history", 1234.0)


def test_no_history_falls_to_static_then_declared() -> None:
    chain = default_chain(lambda sig: None, isolated=False)
    assert chain.estimate(REQ).method == "traced"
    no_entry = EstimateRequest(signature=SIG, declared_mib=9000.0)
    assert chain.estimate(no_entry).method == "declared"


def test_static_failure_falls_to_declared_and_says_why() -> None:
    chain = default_chain(None, isolated=False)
    req = EstimateRequest(entry_point="_entries:always_fails", batch_size=4, declared_mib=512.0)
    est = chain.estimate(req)
    assert est.method == "declared" and est.mib == 512.0
    assert "static:" in est.note


@pytest.mark.parametrize("exc", [RuntimeError("segfault-ish"), SystemExit(3), KeyError("x")])
def test_chain_never_raises(exc: BaseException) -> None:
    seen: list[str] = []
    chain = ChainProvider([Boom(exc)], on_error=lambda name, e: seen.append(name))
    est = chain.estimate(EstimateRequest())
    assert not est.available and est.method == "none" and math.isinf(est.mib)
    assert "--mem" in est.note and "GPU of its own" in est.note
    assert seen == ["boom"]


def test_nothing_known_means_no_estimate() -> None:
    est = default_chain(lambda s: None, isolated=False).estimate(EstimateRequest())
    assert est.method == "none" and "--mem" in est.note


def test_bad_history_value_is_reported_not_used() -> None:
    p = HistoryProvider(lambda s: -5.0)
    with pytest.raises(InputError):
        p.estimate(REQ)
    chain = ChainProvider([p, DeclaredProvider()])
    assert chain.estimate(REQ).method == "declared"


def test_providers_satisfy_the_protocol() -> None:
    for p in (HistoryProvider(lambda s: None), StaticProvider(), DeclaredProvider()):
        assert isinstance(p, EstimateProvider)


def test_isolated_static_runs_in_a_child_process() -> None:
    import pathlib

    here = str(pathlib.Path(__file__).parent)  # _entries.py importable from the workdir
    p = StaticProvider(isolated=True, timeout_s=120)
    est = p.estimate(EstimateRequest(entry_point="_entries:tiny_mlp", batch_size=8, workdir=here))
    assert est is not None and est.method == "traced" and est.mib > 0
    chain = ChainProvider([p])
    bad = chain.estimate(EstimateRequest(entry_point="_entries:always_fails", batch_size=4,
                                         workdir=here))
    assert bad.method == "none" and "static:" in bad.note
