import pytest

from gpuslate._parse import format_gpu_list, format_size, parse_gpu_list, parse_size
from gpuslate.errors import UsageError


@pytest.mark.parametrize("text,expected", [
    ("0", 0), ("40GiB", 40 * 1024**3), ("512MiB", 512 * 1024**2), ("1.5GB", 1_500_000_000),
    ("100", 100), ("2 GiB", 2 * 1024**3), ("1tib", 1024**4), (7, 7),
])
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "GiB", "-1GiB", "40XB", "1e3", "4O", "1.2.3GB", -5])
def test_parse_size_rejects(text):
    with pytest.raises(UsageError, match="invalid size"):
        parse_size(text)


@pytest.mark.parametrize("text,expected", [
    ("0", [0]), ("0,2-3", [0, 2, 3]), ("3,1,1", [1, 3]), (" 0 , 7 ", [0, 7]), ("0-7", list(range(8))),
])
def test_parse_gpu_list(text, expected):
    assert parse_gpu_list(text) == expected
    assert parse_gpu_list(format_gpu_list(expected)) == expected


@pytest.mark.parametrize("text", ["", "a", "1-", "-1", "3-1", "0,,1", "1.5"])
def test_parse_gpu_list_rejects(text):
    with pytest.raises(UsageError, match="GPU"):
        parse_gpu_list(text)


def test_format_size():
    assert format_size(None) == "-"
    assert format_size(0) == "0 B"
    assert format_size(40 * 1024**3) == "40.0 GiB"
