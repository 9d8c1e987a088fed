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
