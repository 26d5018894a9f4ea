from __future__ import annotations

import pytest

from collocate.common.errors import InputError
from collocate.common.units import format_mib, parse_mib


@pytest.mark.parametrize(
    ("text", "mib"),
    [
        ("3GiB", 3072.0),
        ("3G", 3072.0),
        ("3gb", 3072.0),
        ("512MiB", 512.0),
        ("512M", 512.0),
        ("1.5G", 1536.0),
        (" 2 GiB ", 2048.0),
        ("2048", 2048.0),
        ("1024KiB", 1.0),
        ("1048576B", 1.0),
        ("1T", 1024.0 * 1024.0),
        (".5G", 512.0),
        (4096, 4096.0),
        (1.5, 1.5),
    ],
)
def test_parse_mib_reads_sizes(text: str, mib: float) -> None:
    assert parse_mib(text) == pytest.approx(mib)


@pytest.mark.parametrize("text", ["", "GiB", "3 GiBs", "-1G", "3X", "1e3M", "3..5G", "nan", "3 G B"])
def test_parse_mib_rejects_bad_input_with_a_hint(text: str) -> None:
    with pytest.raises(InputError) as err:
        parse_mib(text)
    assert repr(text) in str(err.value)
    assert "3GiB" in str(err.value)  # the hint shows how to write it


def test_format_mib() -> None:
    assert format_mib(512) == "512 MiB"
    assert format_mib(3584) == "3.50 GiB"
