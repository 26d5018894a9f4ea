"""Every bad input names its cause and the fix."""

from __future__ import annotations

import pytest

from collocate.common.errors import CollocateError, InputError, UnknownNameError
from collocate.estimate.api import estimate_memory
from collocate.estimate.entrypoint import check_batch_size, load, resolve


@pytest.mark.parametrize("bad", [0, -4, 2.5, True, "8", None])
def test_non_positive_or_non_integer_batch_size(bad: object) -> None:
    with pytest.raises(InputError, match="positive integer") as info:
        check_batch_size(bad)
    assert "--batch-size" in str(info.value)


def test_batch_size_checked_before_any_work() -> None:
    with pytest.raises(InputError, match="positive integer"):
        estimate_memory("no.such.module:build", batch_size=0)


@pytest.mark.parametrize("entry", ["justamodule", "a:b:c", ":build", "mod:"])
def test_malformed_entry_point(entry: str) -> None:
    with pytest.raises(InputError) as info:
        resolve(entry)
    assert "module" in str(info.value)


def test_module_not_importable() -> None:
    with pytest.raises(InputError, match="cannot import module 'no_such_pkg.models'") as info:
        resolve("no_such_pkg.models:build")
    assert "PYTHONPATH" in str(info.value)


def test_missing_function_lists_what_exists() -> None:
    with pytest.raises(InputError, match="has no attribute 'nope'") as info:
        resolve("_entries:nope")
    assert "tiny_mlp" in str(info.value)


def test_not_callable() -> None:
    with pytest.raises(InputError, match="not callable"):
        resolve("_entries:NOT_CALLABLE")


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("_entries:returns_dict", "returned dict, not a tuple"),
        ("_entries:returns_two", "returned 2 items, expected 3 or 4"),
        ("_entries:returns_not_module", "not a torch.nn.Module"),
        ("_entries:returns_bad_optimizer", "not a torch.optim.Optimizer"),
        ("_entries:returns_no_optimizer", "returned no optimizer"),
        ("_entries:no_batch_size", "cannot be called with batch_size="),
    ],
)
def test_wrong_return_values(entry: str, message: str) -> None:
    with pytest.raises(InputError, match=message) as info:
        estimate_memory(entry, batch_size=4)
    assert info.value.hint


def test_missing_optimizer_can_be_named() -> None:
    work = load("_entries:returns_no_optimizer", 4, optimizer="adam")
    assert type(work.optimizer).__name__ == "Adam"


def test_entry_point_raising_reports_where() -> None:
    with pytest.raises(CollocateError, match="raised ValueError: dataset path") as info:
        estimate_memory("_entries:raises_inside", batch_size=4)
    assert "_entries.py" in str(info.value)


@pytest.mark.parametrize(("kw", "kind"), [({"optimizer": "lamb"}, "optimizer"),
                                          ({"precision": "fp8"}, "precision"),
                                          ({"gpu": "T4"}, "GPU type")])
def test_unknown_names_list_valid_ones(kw: dict[str, str], kind: str) -> None:
    with pytest.raises(UnknownNameError) as info:
        estimate_memory("_entries:tiny_mlp", batch_size=4, **kw)
    assert info.value.kind == kind
    assert info.value.valid
