"""The lean install: commands that need an extra say which line installs it, and the core never loads one.

Each command runs as a real ``gpuslate`` process with the extra's package blocked
(``sys.modules[NAME] = None`` before gpuslate's CLI is imported: ``import NAME``
then fails as it does where the package is not installed). It must exit 2 with
one error line and one hint line naming ``pip install 'gpuslate[EXTRA]'``, no
traceback, and start nothing: no request reaches a server, no port is bound, no
simulated host or results folder is made, no unit is recorded. ``status`` and
``clear --dry-run`` on a simulated host holding real memory must import neither
aiohttp nor matplotlib.
"""

from __future__ import annotations

import http.server
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuslate.cli.commands.demo import scenario
from gpuslate.engines import SEED_ENGINE
from gpuslate.errors import UsageError
from gpuslate.extras import HOST_ONLY, MODULES, Extra, install_hint, installed, missing, require
from helpers import gpuslate_env

ROOT = Path(__file__).resolve().parents[1]  # the clone these tests run from

WRAPPER = """\
import json, sys
for name in json.loads(sys.argv[1]):
    sys.modules[name] = None
from gpuslate.cli.main import main
code = main(json.loads(sys.argv[2]))
loaded = sorted(m for m in ("aiohttp", "matplotlib") if sys.modules.get(m) is not None)
print("LOADED " + json.dumps(loaded), file=sys.stderr)
sys.exit(code)
"""


def gpuslate(args: list[str], hide: tuple[str, ...] = (), cwd: Path | None = None,
             env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``gpuslate ARGS`` in a fresh interpreter with the ``hide`` packages blocked."""
    return subprocess.run([sys.executable, "-c", WRAPPER, json.dumps(list(hide)), json.dumps(args)],
                          capture_output=True, text=True, env=gpuslate_env(env), cwd=cwd, timeout=60)


def loaded(proc: subprocess.CompletedProcess[str]) -> list[str]:
    """The heavy optional packages the process had imported when main returned."""
    line = [ln for ln in proc.stderr.splitlines() if ln.startswith("LOADED ")]
    assert len(line) == 1, proc.stderr
    return json.loads(line[0][len("LOADED "):])


def assert_names_extra(proc: subprocess.CompletedProcess[str], command: str, extras: str,
                       modules: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if not ln.startswith("LOADED ")]
    assert lines == [
        f"gpuslate: error: gpuslate {command} needs {modules}, which "
        f"{'is' if ' and ' not in modules else 'are'} not installed",
        f"gpuslate: hint: install the {extras.replace(',', ' and ')} extra{'s' if ',' in extras else ''}: "
        f"{sys.executable} -m pip install '{ROOT}[{extras}]' (this clone)"], proc.stderr
    assert proc.stdout == ""


class Counting(http.server.BaseHTTPRequestHandler):
    requests: list[str] = []

    def do_GET(self) -> None:  # the standard library's name
        Counting.requests.append(self.path)
        self.send_response(200)
        self.end_headers()

    do_POST = do_GET

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    """A real HTTP server on loopback that records every request it gets."""
    Counting.requests = []
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Counting)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_bench_without_aiohttp_sends_nothing(server: str, tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    proc = gpuslate(["bench", server, "--requests", "2", "--concurrency", "1", "--out", str(out)],
                    hide=("aiohttp",))
    assert_names_extra(proc, "bench", "bench", "aiohttp")
    assert Counting.requests == [] and not out.exists()


def test_bench_tokenizer_without_tokenizers_sends_nothing(server: str, tmp_path: Path) -> None:
    tok = tmp_path / "tokenizer.json"
    tok.write_text("{}")
    proc = gpuslate(["bench", server, "--requests", "2", "--tokenizer", str(tok)], hide=("tokenizers",))
    assert_names_extra(proc, "bench --tokenizer", "tokenizers", "tokenizers")
    assert Counting.requests == []


def test_sim_serve_without_aiohttp_binds_nothing(sim_host) -> None:
    port = free_port()
    proc = gpuslate(["sim", "serve", "--port", str(port), "--memory", "1GiB"], hide=("aiohttp",))
    assert_names_extra(proc, "sim serve", "bench", "aiohttp")
    with socket.socket() as s:  # nothing listens there: the port is still free to bind
        s.bind(("127.0.0.1", port))
    status = gpuslate(["--json", "status"])
    assert status.returncode == 0, status.stderr
    assert not any(g["processes"] for g in json.loads(status.stdout)["gpus"]), status.stdout


def test_experiment_run_without_aiohttp_starts_nothing(sim_host, tmp_path: Path) -> None:
    spec = tmp_path / "spec.toml"
    spec.write_text(scenario(True, free_port(), SEED_ENGINE, tmp_path))
    out = tmp_path / "results"
    proc = gpuslate(["experiment", "run", str(spec), "--out", str(out)], hide=("aiohttp",))
    assert_names_extra(proc, "experiment run", "bench", "aiohttp")
    assert not out.exists()
    ps = gpuslate(["--json", "ps"])
    assert ps.returncode == 0, ps.stderr
    assert json.loads(ps.stdout)["units"] == [], ps.stdout


@pytest.mark.parametrize("hide, extras, modules", [
    (("aiohttp",), "bench", "aiohttp"),
    (("matplotlib",), "plots", "matplotlib"),
    (("aiohttp", "matplotlib"), "bench,plots", "aiohttp and matplotlib"),
])
def test_demo_without_its_extras_starts_nothing(tmp_path: Path, hide: tuple[str, ...], extras: str,
                                                modules: str) -> None:
    temp = tmp_path / "tmp"  # where the demo would make its simulated host
    temp.mkdir()
    out = tmp_path / "demo-out"
    proc = gpuslate(["demo", "--quick", "--out", str(out)], hide=hide, cwd=tmp_path, env={"TMPDIR": str(temp)})
    assert_names_extra(proc, "demo", extras, modules)
    assert list(temp.iterdir()) == [] and not out.exists()


def test_status_and_dry_run_clear_load_no_extra(sim_host, hold) -> None:
    holder = hold("--gpus", "0,1", "--memory", "2GiB")
    status = gpuslate(["--json", "status"])
    assert status.returncode == 0, status.stderr
    assert str(holder.proc.pid) in status.stdout  # it did read the holder
    assert loaded(status) == []
    clear = gpuslate(["--json", "clear", "--gpus", "0", "--dry-run"])
    assert clear.returncode == 0, clear.stderr
    assert str(holder.proc.pid) in clear.stdout  # the plan names the holder, and nothing is signaled
    assert loaded(clear) == []
    assert holder.proc.poll() is None


def test_require_names_only_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    require("status", *Extra)  # the test extra installs every one: nothing missing here
    assert missing(*Extra) == []
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert not installed("matplotlib") and installed("json") and not installed("gpuslate_no_such_module.sub")
    assert missing(Extra.BENCH, Extra.PLOTS) == [Extra.PLOTS]
    with pytest.raises(UsageError) as err:
        require("demo", Extra.BENCH, Extra.PLOTS)
    assert str(err.value) == "gpuslate demo needs matplotlib, which is not installed"
    assert err.value.hint == install_hint(Extra.PLOTS)
    assert set(MODULES) == set(Extra)


def test_extras_match_pyproject() -> None:
    """Every Extra is an optional-dependency group, `all` holds every one but those for real GPU hosts
    only, `test` pulls `all` and those."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
    groups = project["optional-dependencies"]
    assert {e.value for e in Extra} <= set(groups)
    (everything,) = groups["all"]
    assert everything.startswith("gpuslate[")
    assert set(everything[9:-1].split(",")) == {e.value for e in Extra if e not in HOST_ONLY}
    assert "gpuslate[all]" in groups["test"] and all(f"gpuslate[{e.value}]" in groups["test"] for e in HOST_ONLY)
    core = " ".join(project["dependencies"])
    assert "aiohttp" not in core and "matplotlib" not in core
    # a package's name, with - for _ and . (cuda-core provides cuda.core)
    assert all(m.replace(".", "_") in " ".join(groups[e.value]).replace("-", "_") for e in Extra for m in MODULES[e])


def test_the_hint_never_names_a_package_gpuslate_has_not_published(tmp_path: Path) -> None:
    """From a clone: this clone, with this interpreter's pip; from the zipapp (core and rich only):
    the clone way, said as such; installed: the clone it came from. Never 'pip install gpuslate[...]'."""
    assert install_hint(Extra.BENCH) == f"install the bench extra: {sys.executable} -m pip install '{ROOT}[bench]' " \
        "(this clone)"
    pyz = tmp_path / "gpuslate.pyz"
    r = subprocess.run([sys.executable, "-m", "gpuslate", "install", "--out", str(pyz)], capture_output=True,
                       text=True, env=gpuslate_env(), timeout=60)
    assert r.returncode == 0, r.stderr
    code = ("import runpy, sys; sys.modules['aiohttp'] = None; sys.argv = ['gpuslate', 'bench', 'http://x']; "
            f"runpy.run_path({str(pyz)!r}, run_name='__main__')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert r.returncode == 2, r.stderr
    hint = r.stderr.splitlines()[-1]
    assert hint.startswith("gpuslate: hint: install the bench extra: this is the zipapp of gpuslate") and \
        "install gpuslate from a clone" in hint and "not on PyPI" in hint, hint
    assert "'gpuslate[" not in r.stderr


@pytest.mark.parametrize("recorded", [True, False])
def test_after_a_plain_install_the_hint_names_this_interpreter_and_the_clone(tmp_path: Path, recorded: bool) -> None:
    """``pip install /path/to/clone`` (not editable): the package is copied, so the clone is what pip
    recorded (PEP 610 direct_url.json); the hint names it, and this interpreter's pip (a bare ``pip``
    may be another Python's). Without a record: this interpreter, and '.' in the clone."""
    import shutil

    site = tmp_path / "site"
    shutil.copytree(ROOT / "src" / "gpuslate", site / "gpuslate", ignore=shutil.ignore_patterns("__pycache__"))
    info = site / "gpuslate-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: gpuslate\nVersion: 0.1.0\n")
    if recorded:
        (info / "direct_url.json").write_text(json.dumps({"url": ROOT.as_uri(), "dir_info": {}}))
    code = ("import sys; sys.modules['aiohttp'] = None; from gpuslate.cli.main import main; "
            "sys.exit(main(['bench', 'x']))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path,
                       env={**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "PYTHONPATH": str(site)})
    assert r.returncode == 2, r.stderr
    hint = r.stderr.splitlines()[-1]
    where = f"'{ROOT}[bench]' (the clone it came from)" if recorded else \
        "'.[bench]' in the clone gpuslate was installed"
    assert hint.startswith(f"gpuslate: hint: install the bench extra: {sys.executable} -m pip install {where}"), hint
