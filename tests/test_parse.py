import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuslate._parse import (
    MAX_SIZE,
    format_gpu_list,
    format_size,
    parse_gpu_list,
    parse_seconds,
    parse_size,
    size_text,
)
from gpuslate.errors import UsageError


@pytest.mark.parametrize("text,expected", [
    ("0", 0), ("0.0", 0), ("40GiB", 40 * 1024**3), ("512MiB", 512 * 1024**2), ("2 GiB", 2 * 1024**3),
    ("1tib", 1024**4), (7, 7), ("4096B", 4096), ("4096b", 4096),
    # binary, as docker's -m (go-units' RAMInBytes): G, g, GB, GiB, gib are 2**30 bytes
    ("40G", 40 * 1024**3), ("40g", 40 * 1024**3), ("40GB", 40 * 1024**3), ("40gb", 40 * 1024**3),
    ("1.5GB", 1536 * 1024**2), ("512M", 512 * 1024**2), ("64k", 64 * 1024), ("1T", 1024**4),
])
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "GiB", "-1GiB", "40XB", "1e3", "4O", "1.2.3GB", -5, "40PB", "1EiB0"])
def test_parse_size_rejects(text):
    with pytest.raises(UsageError, match="invalid size"):
        parse_size(text)


@pytest.mark.parametrize("text", ["40", "100", "1.5", "97887"])
def test_a_bare_size_is_refused_with_what_to_write(text):
    """``--memory 40`` held 40 bytes, silently: a number without its unit is refused (0 excepted), and
    the one line says what to write."""
    with pytest.raises(UsageError) as exc:
        parse_size(text)
    assert str(exc.value) == f"invalid size '{text}': give its unit, e.g. {text}GiB or {text}MiB ({text}B for bytes)"


@given(st.integers(0, MAX_SIZE))
def test_a_size_is_written_back_as_it_reads(n):
    """size_text (the remote command line's) reads back as the same bytes, with a unit (or 0)."""
    text = size_text(n)
    assert parse_size(text) == n
    assert text == "0" or not text[-1].isdigit()


@pytest.mark.parametrize("text,expected", [
    ("5", 5.0), ("1.5", 1.5), ("1e-05", 1e-05), ("0", 0.0), (".5", 0.5), (" 7 ", 7.0),
    ("5s", 5.0), ("2m", 120.0), ("1h30m", 5400.0), ("500ms", 0.5), ("1.5h", 5400.0), ("90s", 90.0),
    ("1m30s", 90.0), ("250us", 0.00025), (10, 10.0), (2.5, 2.5),
])
def test_parse_seconds_takes_units(text, expected):
    """Every duration option and the unit file's durations: a bare number stays seconds."""
    assert parse_seconds(text) == pytest.approx(expected)


@pytest.mark.parametrize("text", ["", "s", "5x", "-1", "-1s", "inf", "nan", "1e400", "5 s", "1h 30m", "５", True,
                                  "1d", "20000000"])
def test_parse_seconds_rejects(text):
    with pytest.raises(UsageError, match="invalid"):
        parse_seconds(text)


def test_parse_seconds_positive():
    with pytest.raises(UsageError, match="greater than 0"):
        parse_seconds("0s", allow_zero=False)
    assert parse_seconds("1ms", allow_zero=False) == 0.001


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


# -- TOML files: bounded before they are parsed -----------------------------------------------

DEEP_TOML = {
    "arrays": "a = " + "[" * 50_000 + "]" * 50_000 + "\n",
    "inline tables": "a = " + "{b = " * 50_000 + "1" + "}" * 50_000 + "\n",
    "dotted key": "a" + ".a" * 50_000 + " = 1\n",
    "table header": "[" + "a." * 50_000 + "a]\n",
}


@pytest.mark.parametrize("shape", sorted(DEEP_TOML))
def test_a_50000_deep_toml_is_one_line_exit_2_with_file_and_line(tmp_path, sim_host, shape):
    """tomllib recurses per level (a traceback) and is quadratic in a key's parts (a minute):
    both refused before parsing, with FILE:LINE, in well under a second each."""
    import time

    from helpers import run_cli

    path = tmp_path / "gpuslate.toml"
    path.write_text("# deep\n[units.a]\ncommand = ['x']\n" + DEEP_TOML[shape])
    started = time.monotonic()
    r = run_cli("up", "--config", str(path), "a", timeout=30)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert f"{path}:4: malformed TOML" in line and ("deeper than 32" in line or "32 dotted parts" in line)
    assert time.monotonic() - started < 10


def test_toml_bounds_pass_what_a_configuration_uses(tmp_path):
    from gpuslate._toml import read_toml

    text = ('# [[[[ in a comment\n[units."a.b"]\ncommand = ["x", "[[[[", \'{{{{\']\nport = 30000\n'
            'env = {A = "1", B = """multi\nline ]]]] """, C = \'\'\'x\'\'\'\'\'}\n'
            'x.y.z = [1.5, 2.5, [[1], [2]], 1979-05-27T07:32:00.999]\n' + "k" + ".k" * 30 + " = 1\n")
    (tmp_path / "ok.toml").write_text(text)
    _, doc = read_toml(tmp_path / "ok.toml", "unit configuration")
    assert doc["units"]["a.b"]["command"] == ["x", "[[[[", "{{{{"] and doc["units"]["a.b"]["env"]["C"] == "x''"


def test_toml_larger_than_the_bound_is_refused(tmp_path):
    from gpuslate._toml import MAX_BYTES, read_toml

    (tmp_path / "big.toml").write_text("# " + "x" * MAX_BYTES + "\n")
    with pytest.raises(UsageError, match="too large"):
        read_toml(tmp_path / "big.toml", "unit configuration")
