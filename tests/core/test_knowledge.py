"""The one profile-knowledge rule (``collocate.knowledge``), on the simulator's in-memory store."""

from collocate.knowledge import MemoryProfiles, ProfileKnowledge, Sibling, sibling_priors
from collocate.model import UNKNOWN_PROFILE, Job, JobProfile


def test_history_beats_the_program_prior_which_beats_nothing():
    store = MemoryProfiles()
    knowledge = ProfileKnowledge(store)
    assert knowledge.known("a", "p") == (None, "assumed")
    store.record("a", "p", JobProfile(0.2, 0.1))
    store.record("b", "p", JobProfile(0.6, 0.3))
    store.record("c", "p", JobProfile(0.5, 0.2))
    assert knowledge.known("a", "p") == (JobProfile(0.2, 0.1), "history")
    assert knowledge.known("new", "p") == (JobProfile(0.5, 0.2), "similar")
    assert knowledge.known("new", "p", similar=False) == (None, "assumed")
    assert knowledge.known("new", "q") == (None, "assumed")


def test_the_prior_is_over_the_most_recently_measured_commands():
    store = MemoryProfiles()
    for i in range(5):
        store.record(f"old{i}", "p", JobProfile(0.1, 0.1))
    store.record("new0", "p", JobProfile(0.9, 0.5))
    store.record("new1", "p", JobProfile(0.9, 0.5))
    assert ProfileKnowledge(store, recent=2).program_prior("p") == JobProfile(0.9, 0.5)
    store.record("old0", "p", JobProfile(0.1, 0.1))  # measured again: the most recent now
    assert ProfileKnowledge(store, recent=3).program_prior("p") == JobProfile(0.9, 0.5)
    assert ProfileKnowledge(store, recent=1).program_prior("p") == JobProfile(0.1, 0.1)


def test_pending_unmeasured_jobs_take_their_measured_siblings_median():
    pending = [Job("1", profile=UNKNOWN_PROFILE, profile_source="assumed"),
               Job("2", profile=JobProfile(0.3, 0.3), profile_source="history"),
               Job("3", profile=UNKNOWN_PROFILE, profile_source="assumed")]
    program = {"1": "p", "2": "p", "3": "q"}
    running = [Sibling("p", JobProfile(0.8, 0.4), measured=True),
               Sibling("p", JobProfile(0.1, 0.1), measured=False),  # a guess: no vote
               Sibling("q", JobProfile(0.1, 0.1), measured=False)]
    (priced,) = sibling_priors(pending, running, program.get)
    assert priced.id == "1" and priced.profile == JobProfile(0.8, 0.4)
    assert priced.profile_source == "similar"
