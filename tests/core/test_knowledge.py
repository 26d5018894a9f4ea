"""What is known of a job before it runs (``collocate.core.knowledge``), when two submissions are the
same job or siblings (``collocate.core.identity``), and how readings revise beliefs
(``collocate.core.belief``)."""

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collocate.core.belief import UNKNOWN, Belief, exact, family_prior, realized, revise
from collocate.core.identity import JobKeys
from collocate.core.interference import default_interference
from collocate.core.knowledge import MemoryProfiles, ProfileKnowledge, carried_over, learned_here, price_pending
from collocate.core.model import UNKNOWN_PROFILE, Job, JobProfile, JobState, SharingMode

TS = default_interference().modes[SharingMode.TIME_SLICING]
MPS = default_interference().modes[SharingMode.MPS]


def measured(sm: float, dram: float = 0.1) -> Belief:
    return Belief(JobProfile(sm, dram), 0.02 ** 2, 0.02 ** 2, "measured")


# -- identity ---------------------------------------------------------------------------------

def keys(*args: str, cwd: str = "/lab/alice") -> JobKeys:
    return JobKeys.of(["python", "train.py", *args], cwd)


def test_a_resubmission_with_another_seed_output_or_run_name_is_the_same_job():
    first = keys("--job", "mlp", "--out", "runs/a/model.pt", "--seed", "1", "--run-name", "try1")
    again = keys("--job", "mlp", "--out=runs/b/model.pt", "--seed=7", "--run-name", "try2")
    assert first.identity == again.identity
    hydra = JobKeys.of(["python", "train.py", "model=mlp", "seed=1", "hydra.run.dir=out/1"], "/w")
    assert hydra.identity == JobKeys.of(["python", "train.py", "model=mlp", "seed=2", "hydra.run.dir=out/2"], "/w").identity


@pytest.mark.parametrize("other", [
    ("--job", "mlp", "--batch-size", "128"),  # memory changes with the batch
    ("--job", "lstm"),  # another model
])
def test_what_shapes_a_job_makes_another_job(other):
    assert keys("--job", "mlp", "--batch-size", "64").identity != keys(*other).identity
    assert keys("--job", "mlp").identity != keys("--job", "mlp", cwd="/lab/bob").identity


def test_siblings_share_the_script_and_the_non_numeric_non_path_arguments():
    sweep = [keys("--job", "mlp", "--lr", lr, "--hidden", h, "--data", f"data/{d}")
             for lr, h, d in (("0.1", "256", "a"), ("1e-3", "512", "a"), ("0.01", "64", "b"))]
    assert len({k.family for k in sweep}) == 1 and len({k.identity for k in sweep}) == 3
    assert keys("--job", "lstm", "--lr", "0.1").family != sweep[0].family
    assert JobKeys.of(["python", "eval.py", "--job", "mlp"], "/lab/alice").family != sweep[0].family


# -- priors -----------------------------------------------------------------------------------

def test_history_beats_the_family_prior_which_beats_the_prior():
    store = MemoryProfiles()
    knowledge = ProfileKnowledge(store)
    assert knowledge.known("a", "p") == UNKNOWN
    store.record("a", "p", measured(0.2))
    store.record("b", "p", measured(0.6))
    store.record("c", "p", measured(0.5))
    assert knowledge.known("a", "p").profile.sm_activity == 0.2
    similar = knowledge.known("new", "p")
    assert similar.source == "similar" and UNKNOWN_PROFILE.sm_activity == 0.5
    assert similar.profile.sm_activity == pytest.approx((3 * 0.5 + 0.5) / 4)  # median 0.5, shrunk
    assert knowledge.known("new", "p", families=False) == UNKNOWN
    assert knowledge.known("new", "q") == UNKNOWN


def test_a_family_prior_moves_further_and_is_surer_the_more_siblings_agree():
    one = family_prior([measured(0.2)])
    four = family_prior([measured(0.2)] * 4)
    split = family_prior([measured(0.1), measured(0.3), measured(0.1), measured(0.3)])
    assert one.profile.sm_activity == pytest.approx(0.35)  # half-way to the prior's 0.5
    assert four.profile.sm_activity == pytest.approx(0.26)  # 80% of the way
    assert four.sm_var < one.sm_var < UNKNOWN.sm_var
    assert split.sm_var > four.sm_var  # they disagree: less sure
    assert family_prior([]) is None


def test_the_family_prior_is_over_the_most_recently_measured_identities():
    store = MemoryProfiles()
    for i in range(5):
        store.record(f"old{i}", "p", measured(0.1))
    store.record("new0", "p", measured(0.9))
    store.record("new1", "p", measured(0.9))
    assert set(store.family_beliefs("p", 2)) == {"new0", "new1"}
    store.record("old0", "p", measured(0.1))  # measured again: the most recent now
    assert set(store.family_beliefs("p", 1)) == {"old0"}


def test_pending_jobs_without_history_take_their_family_prior_over_observed_running_siblings():
    store = MemoryProfiles()
    knowledge = ProfileKnowledge(store)
    pending = [Job("1"), Job("2", profile=JobProfile(0.3, 0.3), profile_source="history"), Job("3")]
    keys_of = {"1": ("i1", "p"), "2": ("i2", "p"), "3": ("i3", "q")}.__getitem__
    live = [("r1", "p", measured(0.8, 0.4))]
    (priced,) = price_pending(pending, live, keys_of, knowledge)
    assert priced.id == "1" and priced.profile_source == "similar"
    assert priced.profile.sm_activity == pytest.approx(0.65) and priced.profile_var is not None
    assert price_pending(pending, [], keys_of, knowledge) == []


# -- revising beliefs by readings ---------------------------------------------------------------

def test_an_attempt_teaches_its_next_attempt_only_what_its_readings_read():
    """The end-of-attempt rule of both worlds: a requeued job starts its next attempt from what
    the last one read, as history; nothing read, or a job that is not requeued, changes nothing."""
    pending = Job("1", state=JobState.PENDING)
    read = measured(0.6, 0.3)
    assert learned_here(read) == read and learned_here(replace(read, source="inferred")) is not None
    for told in (UNKNOWN, exact(JobProfile(0.6, 0.3)), replace(read, source="history")):
        assert learned_here(told) is None
    assert carried_over(pending, None) is None
    assert carried_over(Job("1", state=JobState.DONE), read) is None
    again = carried_over(pending, read)
    assert again is not None and again.profile == read.profile and again.profile_source == "history"
    assert again.profile_var[0] >= read.sm_var  # no surer than a history


def test_a_job_alone_is_read_exactly_within_a_few_seconds():
    (b,) = revise([UNKNOWN], TS, 0.3, 0.12, samples=3.0)
    assert b.profile.sm_activity == pytest.approx(0.3, abs=0.01)
    assert b.profile.dram_activity == pytest.approx(0.12, abs=0.01)
    assert b.source == "measured" and b.sm_sd < 0.03


def test_jobs_sharing_a_gpu_are_priced_by_what_it_reads_for_them_together():
    true = [JobProfile(0.2, 0.08), JobProfile(0.2, 0.08)]
    reading = realized(TS, true, 0)
    both = revise([UNKNOWN, UNKNOWN], TS, reading, realized(TS, true, 1), samples=5.0)
    assert all(b.source == "inferred" and b.profile.sm_activity < 0.35 for b in both)
    # beside a job measured alone, the newcomer takes what the known one does not explain
    known = measured(0.2, 0.08)
    _, new = revise([known, UNKNOWN], TS, realized(TS, [true[0], JobProfile(0.6, 0.3)], 0),
                    realized(TS, [true[0], JobProfile(0.6, 0.3)], 1), samples=5.0)
    assert new.profile.sm_activity > 0.45 and new.sm_var < UNKNOWN.sm_var


def test_an_exact_belief_is_never_revised():
    told = exact(JobProfile(0.7, 0.3))
    assert revise([told], TS, 0.1, 0.0, samples=10.0) == [told]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.floats(0.02, 1.0), st.floats(0.0, 0.6)), min_size=1, max_size=5),
       st.sampled_from([TS, MPS]), st.floats(1.0, 30.0))
def test_revising_never_leaves_the_unit_interval_and_never_grows_uncertainty(truth, params, seconds):
    profiles = [JobProfile(a, d) for a, d in truth]
    after = revise([UNKNOWN] * len(profiles), params, realized(params, profiles, 0),
                   realized(params, profiles, 1), seconds)
    for b in after:
        assert 0.0 < b.profile.sm_activity <= 1.0 and 0.0 < b.profile.dram_activity <= 1.0
        assert b.sm_var <= UNKNOWN.sm_var + 1e-12 and b.dram_var <= UNKNOWN.dram_var + 1e-12
    # a job alone converges on the truth from any prior
    if len(profiles) == 1:
        assert after[0].profile.sm_activity == pytest.approx(profiles[0].sm_activity, abs=0.02)
