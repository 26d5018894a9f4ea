"""The simulator with several users: fair share and caps run there as in the daemon."""

from collocate.core.fairness import Fairness, UserLimits
from collocate.core.gputypes import parse_cluster
from collocate.core.policies import make_policy
from collocate.sim.engine import SimConfig, Simulation
from collocate.sim.trace import load_trace
from collocate.sim.users import flood_trace, user_waits


def _run(trace, fairness, policy="exclusive"):
    result = Simulation(parse_cluster("2xA100-40GB"), trace, make_policy(policy),
                        SimConfig(fairness=fairness)).run()
    return result, {u.user: u for u in user_waits(result, trace)}


def test_a_flood_delays_no_other_users_first_job_by_more_than_one_job():
    trace = flood_trace(gpus=2, flood_jobs=30, others=2, jobs_each=3, horizon_s=4 * 3600.0, seed=3)
    longest = max(tj.workload.duration_s for tj in trace)
    fair, fair_users = _run(trace, Fairness())
    fifo, fifo_users = _run(trace, Fairness(fair_share=False))
    assert all(fair_users[u].first_wait_s <= longest for u in ("u1", "u2")), fair_users
    assert any(fifo_users[u].first_wait_s > longest for u in ("u1", "u2")), fifo_users
    assert all(r.state == "done" for r in fair.records)  # nobody starved, the flood included


def test_a_cap_bounds_one_users_gpus_in_simulation_too():
    trace = flood_trace(gpus=2, flood_jobs=6, others=0, seed=1)
    result, _ = _run(trace, Fairness(default=UserLimits(max_running_jobs=1)), policy="auto")
    spans = sorted((s[1], s[2]) for r in result.records for s in r.spans)
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:], strict=False))


def test_a_trace_file_names_users(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("id,arrival_s,gpus,duration_s,peak_mib,user\n1,0,1,60,1024,alice\n2,1,1,60,1024,\n")
    assert [tj.user for tj in load_trace(path)] == ["alice", ""]
