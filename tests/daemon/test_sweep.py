"""`--sweep` expansion: grids, ranges, placeholders, and the errors users see."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from collocate.client.sweep import MAX_JOBS, Axis, expand, parse_axis
from collocate.common.errors import InputError


def test_lists_and_inclusive_ranges():
    assert parse_axis("lr=1e-3, 3e-4") == Axis("lr", ("1e-3", "3e-4"))
    assert parse_axis("seed=0..3") == Axis("seed", ("0", "1", "2", "3"))
    assert parse_axis("shift=-1..1").values == ("-1", "0", "1")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("lr", "cannot read --sweep"),
        ("=1,2", "cannot read --sweep"),
        ("my-lr=1", "cannot read --sweep"),
        ("lr=", "empty value"),
        ("lr=1,,2", "empty value"),
        ("seed=5..1", "range is empty"),
        ("lr=0.1..1", "whole numbers"),
        (f"seed=0..{MAX_JOBS}", "asks for"),
    ],
)
def test_bad_axes_say_how_to_write_them(text, message):
    with pytest.raises(InputError, match=message):
        parse_axis(text)


def test_grid_fills_only_declared_placeholders():
    points = expand(
        ["python", "train.py", "--lr={lr}", "--seed", "{seed}", '{"keep": "{braces}"}', "${HOME}"],
        [parse_axis("lr=0.1,0.01"), parse_axis("seed=0..1")],
    )
    assert [p.label() for p in points] == ["lr=0.1,seed=0", "lr=0.1,seed=1", "lr=0.01,seed=0", "lr=0.01,seed=1"]
    assert points[1].command == ("python", "train.py", "--lr=0.1", "--seed", "1", '{"keep": "{braces}"}', "${HOME}")


def test_an_axis_missing_from_the_command_or_named_twice_is_an_error():
    with pytest.raises(InputError, match="--sweep seed is not used") as info:
        expand(["python", "train.py"], [parse_axis("seed=0..1")])
    assert "{seed}" in info.value.hint
    with pytest.raises(InputError, match="twice"):
        expand(["x", "{a}"], [parse_axis("a=1"), parse_axis("a=2")])


def test_a_grid_larger_than_the_limit_is_refused():
    axes = [parse_axis("a=0..999"), parse_axis("b=0..99")]
    with pytest.raises(InputError, match="100000 jobs"):
        expand(["run", "{a}", "{b}"], axes)


@given(st.lists(st.integers(1, 4), min_size=1, max_size=3))
def test_the_grid_has_one_job_per_combination(sizes):
    axes = [Axis(f"a{i}", tuple(f"v{i}_{k}" for k in range(n))) for i, n in enumerate(sizes)]
    points = expand(["cmd"] + [f"{{a{i}}}" for i in range(len(sizes))], axes)
    expected = 1
    for n in sizes:
        expected *= n
    assert len(points) == expected
    assert len({p.command for p in points}) == expected  # all distinct
    assert all("{" not in arg for p in points for arg in p.command)


def test_names_and_output_paths_take_the_placeholders_too():
    one, two = expand(["sleep", "1"], [parse_axis("i=1..2")], ("a{i}", "out-%a-{i}-%j-%%a.txt"))
    assert (one.name("a{i}"), two.name("a{i}")) == ("a1", "a2")
    assert one.name("base") == "base[i=1]"  # a name without placeholders is told apart as before
    assert two.path("out-%a-{i}-%j-%%a.txt") == "out-2-2-%j-%%a.txt"  # %j, %% are the daemon's
    pct, = expand(["x"], [parse_axis("p=50%")], ("o-{p}-%a.txt",))
    assert pct.path("o-{p}-%a.txt") == "o-50%%-50%%.txt"  # a value's % stays a % once the daemon fills
    grid = expand(["x"], [parse_axis("a=1"), parse_axis("b=2")], ("o-{a}-{b}-%a",))
    assert grid[0].path("o-{a}-{b}-%a") == "o-1-2-%a"  # two axes: no single index; the daemon refuses %a


def test_env_values_take_the_placeholders_as_slurms_array_task_id():
    one, two = expand(["sh", "-c", "echo $TASK"], [parse_axis("i=3..4")], ("SLURM_ARRAY_TASK_ID={i}",))
    assert (one.fill("SLURM_ARRAY_TASK_ID={i}"), two.fill("SLURM_ARRAY_TASK_ID={i}")) == (
        "SLURM_ARRAY_TASK_ID=3", "SLURM_ARRAY_TASK_ID=4")
    assert one.command == ("sh", "-c", "echo $TASK")  # used in --env only: still a sweep


def test_output_patterns_are_checked_and_filled_as_sbatch_fills_them():
    from collocate.wire.outputs import check_template, fill

    template = check_template("logs/%x-%j-%u-%A-%%.txt", "--output", "/work")
    assert fill(template, job_id="7", name="a1", user="ann", sweep="") == "/work/logs/a1-7-ann-7-%.txt"
    assert fill(template, job_id="9", name="a3", user="ann", sweep="7").endswith("a3-9-ann-7-%.txt")
    assert check_template("/abs/o", "--output", "/work") == "/abs/o" and check_template(None, "-o", "/") is None
    for bad, words in (("o-%a", "%a is a sweep's index"), ("o-%q", "%j (the job id)"), ("dir/", "names a directory")):
        with pytest.raises(InputError) as err:
            check_template(bad, "--output", "/work")
        assert words in str(err.value) + str(err.value.hint)
