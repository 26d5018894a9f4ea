"""MIG in the simulator: layouts, the per-instance slowdown, power per physical GPU, admission,
out-of-memory against instance memory, time-slicing and MPS inside an instance, and
`collocate simulate --mig-layout` end to end."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from collocate.cli import app
from collocate.common.errors import InputError, UnknownNameError
from collocate.core.gputypes import gpu_type, parse_cluster
from collocate.core.interference import default_interference
from collocate.core.model import GpuId, JobProfile, SharingMode
from collocate.core.policies import make_policy
from collocate.gpus.mig_profiles import split_profiles
from collocate.sim.engine import SimConfig, Simulation
from collocate.sim.metrics import summarize
from collocate.sim.mig import (
    MigInstances,
    default_layout,
    layout_text,
    resolve_layout,
)
from collocate.sim.trace import TraceJob, Workload

MODEL = default_interference()
A100 = gpu_type("A100-40GB")
REPO = Path(__file__).resolve().parents[2]


def job(job_id, *, sm=0.5, dram=0.2, duration=3600.0, peak=4000.0, gpus=1, arrival=0.0, estimate=None):
    estimates = {"peak": peak} | ({"declared": estimate} if estimate is not None else {})
    return TraceJob(job_id, arrival, Workload(job_id, gpus, duration, peak, estimates, JobProfile(sm, dram)))


def mig(trace, policy="exclusive", cluster="1xA100-40GB", layout=None, **config):
    cfg = SimConfig(mig_layout=layout or "default", **config)
    return Simulation(parse_cluster(cluster), trace, make_policy(policy), cfg).run()


def records(result):
    return {r.id: r for r in result.records}


# -- layouts ------------------------------------------------------------------------------------


def test_default_layout_is_the_3g_4g_split_of_each_type():
    assert default_layout("A100-40GB") == ("3g.20gb", "4g.20gb")
    assert default_layout("H100-80GB") == ("3g.40gb", "4g.40gb")
    layout = resolve_layout(None, parse_cluster("1xA100-40GB+1xH100-80GB"))
    assert layout_text(layout) == {"A100-40GB": "3g.20gb+4g.20gb", "H100-80GB": "3g.40gb+4g.40gb"}


def test_layout_instances_take_memory_and_sm_fraction_from_the_profile_table():
    (three, four) = resolve_layout("3g.20gb+4g.20gb", parse_cluster("2xA100-40GB"))["A100-40GB"]
    assert (three.memory_mib, three.sm_fraction) == (pytest.approx(19.5 * 1024), pytest.approx(3 / 7))
    assert four.sm_fraction == pytest.approx(4 / 7)
    h100 = resolve_layout("1g.10gb+1g.10gb+2g.20gb+3g.40gb", parse_cluster("1xH100-80GB"))["H100-80GB"]
    assert [round(i.sm_fraction * 132) for i in h100] == [16, 16, 32, 60]  # SMs, not slices / 7


def test_me_profiles_keep_their_plus():
    assert split_profiles("1g.5gb+me+1g.5gb + 2g.10gb") == ["1g.5gb+me", "1g.5gb", "2g.10gb"]
    layout = resolve_layout("1g.5gb+me+1g.5gb+2g.10gb+3g.20gb", parse_cluster("1xA100-40GB"))
    assert layout_text(layout) == {"A100-40GB": "1g.5gb+me+1g.5gb+2g.10gb+3g.20gb"}


def test_per_type_layouts_for_mixed_clusters():
    nodes = parse_cluster("1xA100-40GB+1xH100-80GB")
    layout = resolve_layout("h100-80gb=1g.10gb+1g.10gb+2g.20gb+3g.40gb", nodes)
    assert layout_text(layout) == {"A100-40GB": "3g.20gb+4g.20gb", "H100-80GB": "1g.10gb+1g.10gb+2g.20gb+3g.40gb"}
    with pytest.raises(InputError, match="does not have"):
        resolve_layout("A100-80GB=3g.40gb+4g.40gb", nodes)


@pytest.mark.parametrize(
    ("text", "cluster", "error", "message"),
    [
        ("3g.40gb+4g.20gb", "1xA100-40GB", UnknownNameError, "3g.20gb"),  # lists the valid ones
        ("3g.20gb+4g.20gb", "1xH100-80GB", UnknownNameError, "3g.40gb"),
        ("4g.20gb+4g.20gb", "1xA100-40GB", InputError, "compute slices"),
        ("1g.10gb+1g.10gb+1g.10gb+1g.10gb+1g.10gb", "1xA100-40GB", InputError, "at most 4"),
        ("3g.20gb+3g.20gb+1g.10gb", "1xA100-40GB", InputError, "cannot be placed"),
        ("3g.20gb++4g.20gb", "1xA100-40GB", InputError, "empty MIG profile"),
        ("3g.20gb,4g.20gb", "1xA100-40GB", InputError, "more than one layout"),
        ("3g.71gb+4g.71gb", "1xV100-32GB", UnknownNameError, "A100-40GB"),  # no MIG on V100
        ("7g.141gb", "1xH200-141GB", InputError, "no measured size"),
    ],
)
def test_bad_layouts_say_why(text, cluster, error, message):
    with pytest.raises(error, match=message):
        resolve_layout(text, parse_cluster(cluster))


def test_instances_are_gpus_of_their_own_in_the_snapshot():
    sim = Simulation(parse_cluster("2x(2xA100-40GB)"), [job("a")], make_policy("exclusive"),
                     SimConfig(mig_layout="4g.20gb+2g.10gb+1g.10gb"))
    assert isinstance(sim.devices, MigInstances)
    snap = sim.world.snapshot(0.0)
    assert snap.ids[:3] == (GpuId("node0", 0, "1.0"), GpuId("node0", 0, "2.0"), GpuId("node0", 0, "3.0"))
    assert len(snap) == 12 and snap.node.tolist() == [0] * 6 + [1] * 6
    assert snap.speed[:3].tolist() == pytest.approx([4 / 7, 2 / 7, 1 / 7])
    assert snap.total_mib[:3].tolist() == pytest.approx([19.5 * 1024, 9.62 * 1024, 9.62 * 1024])


# -- the model through whole simulations --------------------------------------------------------


def test_a_job_alone_on_a_3g_instance_takes_duration_times_the_mig_slowdown():
    profile = JobProfile(0.6, 0.3)
    result = mig([job("a", sm=0.6, dram=0.3, duration=3600.0)], layout="3g.20gb+4g.20gb")
    r = records(result)["a"]
    assert r.last_gpus == "node0:0/1.0"
    expected = 3600.0 * MODEL.alone(profile, 3 / 7)
    assert r.end - r.submit == pytest.approx(expected, rel=1e-9)
    assert expected == pytest.approx(3600.0 * 1.05 * (0.6 * 7 / 3) ** 0.65)


def test_two_instances_of_one_gpu_do_not_slow_each_other():
    trace = [job("big", sm=0.9, duration=1800.0), job("small", sm=0.9, duration=1800.0)]
    r = records(mig(trace, layout="3g.20gb+4g.20gb"))
    assert (r["big"].last_gpus, r["small"].last_gpus) == ("node0:0/1.0", "node0:0/2.0")
    for rec, f in ((r["big"], 3 / 7), (r["small"], 4 / 7)):
        alone = MODEL.alone(JobProfile(0.9, 0.2), f)
        assert rec.end - rec.submit == pytest.approx(1800.0 * alone, rel=1e-9)


@pytest.mark.parametrize("sharing", list(SharingMode))
def test_jobs_on_one_instance_share_it_by_the_mode_with_activity_relative_to_the_instance(sharing):
    trace = [job("a", sm=0.2, dram=0.1), job("b", sm=0.2, dram=0.1)]
    r = records(mig(trace, policy="declared-memory", layout="3g.20gb", sharing=sharing))
    assert r["a"].last_gpus == r["b"].last_gpus == "node0:0/1.0"
    f = 3 / 7
    inside = MODEL.slowdown(sharing, JobProfile(0.2 / f, 0.1 / f), [JobProfile(0.2 / f, 0.1 / f)])
    assert inside > 1.0
    expected = 3600.0 * MODEL.alone(JobProfile(0.2, 0.1), f) * inside
    assert r["a"].end == pytest.approx(expected, rel=1e-9) and r["b"].end == pytest.approx(expected, rel=1e-9)


def test_a_physical_gpu_draws_idle_power_once_and_utilization_is_per_physical_gpu():
    duration = 3600.0
    result = mig([job("a", sm=0.3, duration=duration)], cluster="2xA100-40GB", layout="1g.5gb+1g.5gb+2g.10gb+3g.20gb")
    assert records(result)["a"].last_gpus == "node0:0/1.0"  # a 1g instance: 1/7 of the SMs
    slowdown = MODEL.alone(JobProfile(0.3, 0.2), 1 / 7)
    busy = 1 / 7  # the job saturates its instance: min(1/7, 0.3 / slowdown) of the whole GPU
    assert 0.3 / slowdown > busy
    makespan = duration * slowdown
    draw = A100.idle_watts + (A100.max_watts - A100.idle_watts) * busy**MODEL.power_exponent
    expected = draw * makespan + A100.idle_watts * makespan
    assert result.makespan_s == pytest.approx(makespan, rel=1e-9)
    assert result.energy_j == pytest.approx(expected, rel=1e-9)  # 2 GPUs: 2 idles, not 8
    assert result.gpu_count == 2
    assert result.sm_util == pytest.approx(busy / 2, rel=1e-9)


def test_published_mig_anchor_through_a_full_simulation():
    # CARMA's collocation study (A100-40GB): ResNet-152 (SM 0.82) +33% on a 4g instance,
    # DLRM (SM 0.05) +5% on a 3g instance.
    trace = [job("1-resnet152", sm=0.82, duration=3000.0), job("2-dlrm", sm=0.05, duration=1500.0, peak=1468.0)]
    r = records(mig(trace, layout="4g.20gb+3g.20gb"))
    assert (r["1-resnet152"].last_gpus, r["2-dlrm"].last_gpus) == ("node0:0/1.0", "node0:0/2.0")
    assert (r["1-resnet152"].end - r["1-resnet152"].submit) / 3000.0 == pytest.approx(1.33, abs=0.005)
    assert (r["2-dlrm"].end - r["2-dlrm"].submit) / 1500.0 == pytest.approx(1.05, abs=1e-9)


def test_a_job_bigger_than_its_instance_crashes_out_of_memory_and_cannot_retry():
    # Placed on the estimate (10 GiB), it allocates its real 25 GiB: more than any instance.
    # ``exclusive`` runs nothing beside it, so it is unfenced: it crashes at the instance's size,
    # and then no instance can hold it.
    trace = [job("a", peak=25_000.0, estimate=10_000.0)]
    r = records(mig(trace, estimator="declared"))["a"]
    assert r.oom_crashes == 1 and r.state == "failed"
    assert "largest MIG instance" in r.reason
    whole = Simulation(parse_cluster("1xA100-40GB"), trace, make_policy("exclusive"), SimConfig(estimator="declared"))
    assert records(whole.run())["a"].state == "done"  # it fits a whole GPU


def test_multi_gpu_jobs_are_rejected_at_admission_with_the_reason():
    result = mig([job("pair", gpus=2), job("one")], cluster="4xA100-40GB")
    r = records(result)
    assert r["pair"].state == "rejected" and "NCCL" in r["pair"].reason
    assert r["one"].state == "done"
    assert summarize(result).rejected == 1


def test_jobs_larger_than_every_instance_are_rejected_up_front():
    r = records(mig([job("big", peak=30_000.0)]))["big"]
    assert r.state == "rejected" and "largest MIG instance has 19968 MiB" in r.reason


# -- property ------------------------------------------------------------------------------------


class _CheckedMig(Simulation):
    """Asserts after every launch that no instance holds more committed memory than it has."""

    def _launch(self, job_id, gpus, now, room_mib=None):
        super()._launch(job_id, gpus, now, room_mib)
        for i in gpus:
            committed = self.world.committed_mib(i)
            assert committed <= self.total[i] + 1e-6, (self.ids[i], committed, self.total[i])


LAYOUTS = ("3g.20gb+4g.20gb", "1g.5gb+1g.5gb+1g.5gb+2g.10gb+2g.10gb", "2g.10gb+2g.10gb+3g.20gb", "4g.20gb+2g.10gb+1g.10gb")

traces = st.lists(
    st.tuples(st.floats(0, 600), st.floats(60, 3600), st.floats(300, 19_000), st.floats(0, 1), st.integers(1, 2)),
    min_size=1, max_size=10,
).map(lambda rows: [
    job(f"j{k}", sm=sm, duration=d, peak=mem, gpus=g, arrival=sum(r[0] for r in rows[: k + 1]))
    for k, (_, d, mem, sm, g) in enumerate(rows)
])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(traces, st.sampled_from(LAYOUTS), st.sampled_from(("declared-memory", "carma-magm", "auto")))
def test_memory_aware_policies_never_overcommit_an_instance(trace, layout, policy):
    config = SimConfig(mig_layout=layout)
    result = _CheckedMig(parse_cluster("2xA100-40GB"), trace, make_policy(policy), config).run()
    s = summarize(result)
    assert s.oom_crashes == 0  # estimates are the peaks: placement alone keeps memory safe
    assert s.done + s.rejected == len(trace)
    smallest_largest = 9.62 * 1024  # the largest instance of the most finely split layout
    assert all((r.gpus > 1) == (r.state == "rejected") for r in result.records if r.peak_mib <= smallest_largest)


# -- CLI -----------------------------------------------------------------------------------------


def test_cli_simulates_mig_end_to_end(shared_data):
    data = Path(os.path.relpath(shared_data, REPO))  # ../shared/data, as a user types it
    out = subprocess.run(
        [sys.executable, "-m", "collocate.cli", "simulate",
         "--trace", str(data / "carma-heavy-60.csv"), "--workloads", str(data / "carma-workloads.csv"),
         "--cluster", "4xA100-40GB", "--mig-layout", "default", "--policy", "exclusive,carma-magm,auto",
         "--format", "json"],
        capture_output=True, text=True, timeout=120, cwd=REPO, check=False,
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["sharing"] == "time-slicing" and doc["mig_layout"] == {"A100-40GB": "3g.20gb+4g.20gb"}
    assert [p["policy"] for p in doc["policies"]] == ["exclusive", "carma-magm", "auto"]
    for p in doc["policies"]:
        # 2-GPU jobs (3) and jobs over the 19968 MiB of the larger instance (5) are rejected
        assert p["rejected"] == 8 and p["done"] == 52 and p["oom_crashes"] == 0


def test_cli_table_names_the_layout(shared_data):
    result = CliRunner().invoke(app, [
        "simulate", "--trace", str(shared_data / "carma-heavy-60.csv"),
        "--workloads", str(shared_data / "carma-workloads.csv"), "--policy", "exclusive",
        "--sharing", "mps", "--mig-layout", "4g.20gb+3g.20gb",
    ])
    assert result.exit_code == 0, result.output
    assert "mps 4g.20gb+3g.20gb" in result.output


@pytest.mark.parametrize(
    ("args", "error", "message"),
    [
        (["--sharing", "mig"], InputError, "no sharing mode"),
        (["--mig-layout", "3g.40gb"], UnknownNameError, "3g.20gb"),
        (["--mig-layout", "default", "--cluster", "2xL4-24GB"], UnknownNameError, "MIG-capable"),
        (["--sharing", "shared"], InputError, "mps"),
    ],
)
def test_cli_mig_errors_explain_the_fix(args, error, message):
    result = CliRunner().invoke(app, ["simulate", "--synthetic", "5", *args])
    assert isinstance(result.exception, error), result.output
    assert message in str(result.exception)


# -- power ---------------------------------------------------------------------------------------


def test_a_warming_job_draws_warm_up_power_on_its_instance_too():
    """The engine's one power rule under MIG: a job in its first steps keeps its instance at the
    warm-up level (``warmup_busy``, relative to the instance), so its GPU draws that share of it."""
    from dataclasses import replace

    def energy(warmup_busy):
        model = replace(MODEL, warmup_busy=warmup_busy)
        workload = Workload("w", 1, 60.0, 1000.0, {"peak": 1000.0}, JobProfile(0.2, 0.1), warmup_s=10.0)
        cfg = SimConfig(mig_layout="3g.20gb+4g.20gb", interference=model, ramp_s=0.0)
        result = Simulation(parse_cluster("1xA100-40GB"), [TraceJob("a", 0.0, workload)],
                            make_policy("exclusive"), cfg).run()
        assert records(result)["a"].last_gpus == "node0:0/1.0"  # the 3g instance
        return result.energy_j

    assert MODEL.warmup_busy > 0
    extra = (A100.max_watts - A100.idle_watts) * (3 / 7 * MODEL.warmup_busy) ** MODEL.power_exponent
    assert energy(MODEL.warmup_busy) - energy(0.0) == pytest.approx(10.0 * extra, rel=1e-9)


# -- the instance's parameters ------------------------------------------------------------------


def test_an_instance_is_priced_by_mig_parameters_read_from_their_own_table(tmp_path):
    """``[mig]`` holds the instance's parameters; a file written before MIG left the sharing
    modes (``[modes.mig]``, by an older ``bench calibrate``) still loads."""
    from collocate.core.interference import InstanceParams, load_interference

    modes = "[modes.time-slicing]\nbase = 0.1\n[modes.mps]\nbase = 0.2\n"
    for table in ("[mig]", "[modes.mig]"):
        path = tmp_path / "model.toml"
        path.write_text(f"{modes}{table}\nbase = 0.5\nspeed_exponent = 1.0\n")
        model = load_interference(path)
        assert model.instance == InstanceParams(0.5, 1.0)
        assert model.alone(JobProfile(0.6, 0.1), 3 / 7) == pytest.approx(1.5 * 1.4)
        assert model.alone(JobProfile(0.6, 0.1), 1.0) == 1.0  # a whole GPU (or a 7g instance)
    path.write_text(f"{modes}[mig]\nbase = 0.5\nper_sm = 1.0\n")
    with pytest.raises(InputError, match=r"\[mig\]"):
        load_interference(path)
