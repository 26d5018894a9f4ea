"""Trace and catalogue parsing: good rows load, bad rows name the file, line and field."""

import pytest

from collocate.common.errors import InputError
from collocate.sim.trace import load_catalogue, load_trace


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_carma_traces_load_with_the_catalogue(shared_data):
    catalogue = load_catalogue(shared_data / "carma-workloads.csv")
    trace = load_trace(shared_data / "carma-mix-90.csv", catalogue)
    assert len(trace) == 90
    first = trace[0].workload
    assert first.name == "gpt2_large_2" and first.gpus == 2 and first.duration_s == pytest.approx(65.72 * 60)


def test_self_contained_csv_and_jsonl(tmp_path):
    csv_trace = write(tmp_path, "t.csv", "id,arrival_s,gpus,duration_s,peak_mib,sm_activity\na,0,1,60,1000,0.3\nb,5,2,30,500,\n")
    jobs = load_trace(csv_trace)
    assert [j.id for j in jobs] == ["a", "b"] and jobs[0].workload.profile.sm_activity == 0.3
    assert jobs[0].workload.warmup_s == 0.0  # optional column
    warm = write(tmp_path, "w.csv", "id,arrival_s,gpus,duration_s,peak_mib,warmup_s\na,0,1,60,1000,4.5\n")
    assert load_trace(warm)[0].workload.warmup_s == 4.5
    jsonl = write(tmp_path, "t.jsonl", '{"id": "a", "arrival_s": 0, "gpus": 1, "duration_s": 60, "peak_mib": 1000}\n\n')
    assert load_trace(jsonl)[0].workload.peak_mib == 1000
    ranked = write(tmp_path, "p.csv", "id,arrival_s,gpus,duration_s,peak_mib,priority\na,0,1,60,1000,5\nb,1,1,60,1000,\n"
                                      "c,2,1,60,1000,-3\n")
    assert [j.priority for j in load_trace(ranked)] == [5, 0, -3]  # optional; a --nice is negative


@pytest.mark.parametrize(
    "text, message",
    [
        ("id,arrival_s,workload\n1,0,nosuch\n", "t.csv:2: unknown workload 'nosuch'"),
        ("id,arrival_s,gpus,duration_s,peak_mib\n1,-5,1,60,100\n", "t.csv:2: 'arrival_s' must be a finite number >= 0"),
        ("id,arrival_s,gpus,duration_s,peak_mib\n1,10,1,60,100\n2,5,1,60,100\n", "t.csv:3: arrival_s 5 is earlier"),
        ("id,gpus\n1,1\n", "t.csv:1: header lacks column(s) arrival_s"),
        ("id,arrival_s,gpus,duration_s,peak_mib\n1,0,one,60,100\n", "t.csv:2: 'gpus' must be a number"),
        ("id,arrival_s,gpus,duration_s\n1,0,1,60\n", "t.csv:2: missing column(s) peak_mib"),
        ("id,arrival_s,gpus,duration_s,peak_mib\n1,0,1,60,100\n1,1,1,60,100\n", "t.csv:3: job id '1' appears twice"),
        ("id,arrival_s,gpus,duration_s,peak_mib,sm_activity\n1,0,1,60,100,1.5\n", "fraction in [0, 1]"),
        ("id,arrival_s,gpus,duration_s,peak_mib,priority\n1,0,1,60,100,high\n",
         "t.csv:2: 'priority' must be a whole number within +/-1,000,000, got 'high'"),
        ("id,arrival_s,gpus,duration_s,peak_mib,priority\n1,0,1,60,100,1.5\n", "'priority' must be a whole number"),
        ("id,arrival_s,gpus,duration_s,peak_mib,warmup_s\n1,0,1,60,100,61\n",
         "t.csv:2: startup_s and warmup_s (61 s) are longer than duration_s 60"),
    ],
)
def test_bad_rows_are_reported_with_file_line_and_field(tmp_path, shared_data, text, message):
    catalogue = load_catalogue(shared_data / "carma-workloads.csv")
    with pytest.raises(InputError) as err:
        load_trace(write(tmp_path, "t.csv", text), catalogue)
    assert message in str(err.value)


def test_bad_jsonl_and_missing_catalogue(tmp_path):
    with pytest.raises(InputError, match=r"t.jsonl:1: not valid JSON"):
        load_trace(write(tmp_path, "t.jsonl", "{oops\n"))
    with pytest.raises(InputError, match="no catalogue was given"):
        load_trace(write(tmp_path, "t.csv", "id,arrival_s,workload\n1,0,vgg\n"))
    with pytest.raises(InputError, match="cannot open"):
        load_trace(tmp_path / "missing.csv")
