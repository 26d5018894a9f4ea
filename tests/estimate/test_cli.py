"""`collocate estimate` through the real app."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from collocate.cli import app
from collocate.common.errors import InputError

runner = CliRunner()


def test_json_output() -> None:
    res = runner.invoke(app, ["estimate", "_entries:tiny_mlp", "-b", "8", "--format", "json",
                              "--gpu", "A100-40GB", "--baselines"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    assert d["method"] == "traced" and d["details"]["gpu"] == "A100-40GB"
    assert set(d["baselines"]) == {"horus", "faketensor"}


def test_table_output() -> None:
    res = runner.invoke(app, ["estimate", "_entries:tiny_mlp", "-b", "8"])
    assert res.exit_code == 0, res.output
    assert "method: traced" in res.output and "activations" in res.output


def test_bad_batch_size_is_an_input_error() -> None:
    res = runner.invoke(app, ["estimate", "_entries:tiny_mlp", "-b", "-3"])
    assert isinstance(res.exception, InputError)


def test_no_fallback_option() -> None:
    res = runner.invoke(app, ["estimate", "_entries:item_model", "-b", "8", "--fallback", "none"])
    assert res.exception is not None and "--mem" in str(res.exception)
