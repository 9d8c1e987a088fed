"""``gpuslate --host H install`` against real sshd processes on loopback.

``clean`` is a host whose login environment has a Python >= 3.10 and nothing
else: a venv made with ``--without-pip`` (no site packages, no pip, no
network) first on its PATH, no PYTHONPATH, its own HOME. ``import gpuslate``
fails there until ``install`` copied the zipapp. ``oldpy`` has a ``python3``
that says it is 3.8.
"""

from __future__ import annotations

import io
import json
import os
import select
import shutil
import stat
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuslate.errors import UsageError
from gpuslate.remote.zipapp import (
    BUNDLED,
    MIN_PYTHON,
    build,
    check_prefix,
    parse_python_version,
)
from sshd_hosts import SshLab, free_port, sshd_available, start_lab

pytestmark = [pytest.mark.ssh, pytest.mark.slow]  # real sshd processes, a zipapp built and run through them

SCHEMAS = Path(__file__).resolve().parents[2] / "docs" / "schemas"
OLD_PYTHON = "#!/bin/sh\n# a python3 of another age: prints its version, whatever it is asked\necho 'Python 3.8.10'\n"


@pytest.fixture(scope="module")
def install_lab() -> Iterator[SshLab]:
    if not sshd_available():
        msg = "no /usr/sbin/sshd or ssh client: apt-get install openssh-server openssh-client"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    base = Path(tempfile.mkdtemp(prefix="gsi-", dir="/tmp"))
    try:
        clean_py = base / "cleanpy"
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(clean_py)], check=True, timeout=60)
        old = base / "oldpy"
        old.mkdir()
        (old / "python3").write_text(OLD_PYTHON)
        (old / "python3").chmod(0o755)
        homes = {n: base / f"home-{n}" for n in ("clean", "oldpy")}
        for h in homes.values():
            h.mkdir()
        system = "/usr/bin:/bin"
        env = {"clean": {"PATH": f"{clean_py / 'bin'}:{system}", "PYTHONPATH": "", "HOME": str(homes["clean"])},
               "oldpy": {"PATH": f"{old}:{system}", "PYTHONPATH": "", "HOME": str(homes["oldpy"])}}
        lab = start_lab(base / "lab", ["clean", "oldpy"], missing=("clean", "oldpy"), env=env)
        try:
            yield lab
        finally:
            lab.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def gs(install_lab: SshLab) -> Callable[..., subprocess.CompletedProcess[str]]:
    def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "gpuslate", *args], capture_output=True, text=True, check=False,
                              env=install_lab.client_env(), timeout=timeout, cwd=str(install_lab.base),
                              stdin=subprocess.DEVNULL)

    return run


def _home(lab: SshLab, name: str) -> Path:
    return lab.base.parent / f"home-{name}"


def _host_doc(r: subprocess.CompletedProcess[str]) -> dict:
    assert r.stdout, r.stderr
    doc = json.loads(r.stdout)
    assert doc["schema"] == "gpuslate.fleet.v1" and len(doc["hosts"]) == 1
    return doc["hosts"][0]


def _no_traceback(r: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout


def test_clean_host_gets_gpuslate_through_install(install_lab, gs, hold):
    clean = install_lab.hosts["clean"]
    py = install_lab.base.parent / "cleanpy" / "bin" / "python3"
    # the premise: that interpreter has no gpuslate and no rich
    for module in ("gpuslate", "rich"):
        probe = subprocess.run([str(py), "-c", f"import {module}"], capture_output=True, check=False, text=True,
                               env={"PATH": "/usr/bin"})
        assert probe.returncode == 1 and f"No module named '{module}'" in probe.stderr

    before = gs("--host", "clean", "status", "--json")
    assert before.returncode == 3, before.stderr
    assert _host_doc(before)["error"]["type"] == "gpuslate_missing"
    assert "install" in _host_doc(before)["error"]["hint"]

    r = gs("--host", "clean", "install", "--json")
    assert r.returncode == 0, r.stderr
    entry = _host_doc(r)
    assert entry["ok"] and entry["error"] is None
    res = entry["result"]
    assert res["schema"] == "gpuslate.install.v1" and res["status"] == "installed"
    assert res["status_check"] == "ok" and res["remote_command"] is None
    assert tuple(int(x) for x in res["python_version"].split(".")[:2]) >= MIN_PYTHON
    assert res["python"] == str(py) or Path(res["python"]).resolve() == py.resolve()
    home = _home(install_lab, "clean")
    pyz, launcher = home / ".local/share/gpuslate/gpuslate.pyz", home / ".local/bin/gpuslate"
    assert (res["pyz"], res["launcher"]) == (str(pyz), str(launcher))
    assert stat.S_IMODE(launcher.stat().st_mode) == 0o755 and stat.S_IMODE(pyz.stat().st_mode) == 0o644
    assert pyz.stat().st_size == res["bytes"]
    assert not list(pyz.parent.glob("*.tmp-*")) and not list(launcher.parent.glob("*.tmp-*"))
    with zipfile.ZipFile(pyz) as z:
        names = set(z.namelist())
    assert "gpuslate/cli/__init__.py" in names and "rich/table.py" in names and "__main__.py" in names

    # ~/.local/bin is not on that PATH: the fleet finds the launcher all the same
    held = hold("--memory", "5GiB", "--gpus", "0,3", host=clean.sim)
    r = gs("--host", "clean", "--sim", str(clean.sim.root), "status", "--json")
    assert r.returncode == 0, r.stderr
    doc = _host_doc(r)["result"]
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.Draft202012Validator(json.loads((SCHEMAS / "status.v1.json").read_text())).validate(doc)
    pids = {p["pid"] for g in doc["gpus"] for p in g["processes"]}
    assert held.pid in pids
    assert [g["memory"]["used"] for g in doc["gpus"]] == [5 * 1024**3, 0, 0, 5 * 1024**3]

    # installing again replaces the files in place; the text output says where it went
    again = gs("--host", "clean", "install")
    assert again.returncode == 0, again.stderr
    assert "installed" in again.stdout and str(launcher) in again.stdout
    _no_traceback(again)


def test_another_prefix_names_the_remote_command(install_lab, gs):
    home = _home(install_lab, "clean")
    r = gs("--host", "clean", "install", "--prefix", str(home / "opt"), "--json")
    assert r.returncode == 0, r.stderr
    res = _host_doc(r)["result"]
    launcher = home / "opt" / "bin" / "gpuslate"
    assert res["launcher"] == res["remote_command"] == str(launcher) and launcher.is_file()
    text = gs("--host", "clean", "install", "--prefix", str(home / "opt"))
    assert f"GPUSLATE_REMOTE_COMMAND={launcher}" in text.stdout
    env = {**install_lab.client_env(), "GPUSLATE_REMOTE_COMMAND": str(launcher)}
    ps = subprocess.run([sys.executable, "-m", "gpuslate", "--host", "clean", "ps", "--json"], capture_output=True,
                        check=False,
                        text=True, env=env, timeout=60, stdin=subprocess.DEVNULL)
    assert ps.returncode == 0, ps.stderr
    assert _host_doc(ps)["result"]["schema"] == "gpuslate.ps.v1"


def test_old_python_is_refused_before_anything_is_written(install_lab, gs):
    r = gs("--host", "oldpy", "install", "--json")
    assert r.returncode == 3, r.stderr
    err = _host_doc(r)["error"]
    assert err["type"] == "python_unsupported" and "3.8.10" in err["message"] and ">= 3.10" in err["message"]
    assert not (_home(install_lab, "oldpy") / ".local").exists()
    text = gs("-H", "oldpy", "install")
    assert text.returncode == 3 and "python_unsupported" in text.stdout
    _no_traceback(text)


def test_host_without_that_python(install_lab, gs):
    r = gs("--host", "clean", "install", "--python", "/nonexistent/python3", "--json")
    assert r.returncode == 3, r.stderr
    err = _host_doc(r)["error"]
    assert err["type"] == "python_unsupported" and "/nonexistent/python3" in err["message"]


def test_unwritable_prefix_is_named(install_lab, gs):
    r = gs("--host", "clean", "install", "--prefix", "/proc/gpuslate-nowhere", "--json")
    assert r.returncode == 5, r.stderr
    err = _host_doc(r)["error"]
    assert err["type"] == "install_failed" and "/proc/gpuslate-nowhere" in err["message"]
    _no_traceback(r)


@pytest.mark.parametrize("shape", ["root-link-to-theirs", "their-link", "their-folder", "group-writable",
                                   "home-then-their-link"])
def test_a_prefix_through_another_users_folder_is_refused(install_lab, gs, other_user, shape):
    """install --prefix P where a folder below P leads into another user's folder (issue 25): root's
    launcher would run whatever that user puts there. Every component is walked from / (or from the
    home, for ~/...) under the state folder's rules; nothing is written there."""
    base = Path(tempfile.mkdtemp(prefix="gsp-", dir="/tmp"))
    try:
        base.chmod(0o755)
        theirs = base / "theirs"
        theirs.mkdir(mode=0o755)
        os.chown(theirs, other_user.pw_uid, other_user.pw_gid)
        prefix = str(base / "p" / "opt")
        (base / "p").mkdir(mode=0o755)
        if shape == "root-link-to-theirs":  # root's own link, to a folder the user owns
            (base / "p" / "opt").symlink_to(theirs)
        elif shape == "their-link":  # the user's link, to a folder of root's
            (base / "mine").mkdir()
            (base / "p" / "opt").symlink_to(base / "mine")
            os.chown(base / "p" / "opt", other_user.pw_uid, other_user.pw_gid, follow_symlinks=False)
        elif shape == "their-folder":
            os.chown(base / "p", other_user.pw_uid, other_user.pw_gid)
        elif shape == "group-writable":
            (base / "p").chmod(0o775)
        else:  # ~/link where the link is the user's
            home = _home(install_lab, "clean")
            link = home / f"gsp-{base.name}"
            link.symlink_to(theirs)
            os.chown(link, other_user.pw_uid, other_user.pw_gid, follow_symlinks=False)
            prefix = f"~/{link.name}"
        r = gs("--host", "clean", "install", "--prefix", prefix, "--json")
        assert r.returncode == 5, (r.stdout[-800:], r.stderr[-800:])
        err = _host_doc(r)["error"]
        assert err["type"] == "install_failed" and "refusing install prefix" in err["message"], err
        assert not list(theirs.iterdir()) and not list((base / "p").rglob("gpuslate*"))
        _no_traceback(r)
    finally:
        for link in _home(install_lab, "clean").glob("gsp-*"):
            link.unlink()
        shutil.rmtree(base, ignore_errors=True)


def test_unreachable_host_is_named_and_the_others_installed(install_lab, gs):
    install_lab.add_alias("nobody", free_port())  # nothing listens there
    r = gs("-H", "nobody", "-H", "clean", "install", "--json")
    assert r.returncode == 7, r.stderr
    hosts = {h["host"]: h for h in json.loads(r.stdout)["hosts"]}
    assert hosts["nobody"]["error"]["type"] == "unreachable" and hosts["nobody"]["exit_code"] == 3
    assert hosts["clean"]["ok"] and hosts["clean"]["result"]["status"] == "installed"


def test_bad_input_contacts_no_host(install_lab, gs):
    for args in (["install"], ["--host", "clean", "install", "--prefix", "relative/dir"],
                 ["--host", "clean", "install", "--out", "x.pyz"], ["--host", "clean", "install", "--python", "-c"],
                 ["--slurm", "install"]):
        r = gs(*args)
        assert r.returncode == 2, (args, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith("gpuslate: error:"), r.stderr
        assert r.stdout == ""


def test_out_writes_a_zipapp_that_runs_in_a_clean_interpreter(install_lab, gs, tmp_path, sim_host):
    out = tmp_path / "gpuslate.pyz"
    r = gs("install", "--out", str(out), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["schema"] == "gpuslate.install.v1" and doc["status"] == "written" and doc["pyz"] == str(out)
    py = install_lab.base.parent / "cleanpy" / "bin" / "python3"
    ran = subprocess.run([str(py), str(out), "--sim", str(sim_host.root), "status", "--json"], capture_output=True,
                         check=False,
                         text=True, env={"PATH": "/usr/bin:/bin", "GPUSLATE_STATE_DIR": str(tmp_path / "st")},
                         timeout=60)
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout)["schema"] == "gpuslate.status.v1"
    # without setproctitle there, a --title holder says what it cannot do, and still holds
    hold = subprocess.Popen([str(py), str(out), "--sim", str(sim_host.root), "sim", "hold", "--memory", "1GiB",
                             "--title", "sglang::scheduler"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={"PATH": "/usr/bin:/bin"}, start_new_session=True)
    try:
        ready, _, _ = select.select([hold.stdout], [], [], 20)  # its ready line, or 20 s
        line = hold.stdout.readline() if ready and hold.stdout else ""
        assert line and json.loads(line)["pid"] == hold.pid
    finally:
        os.killpg(hold.pid, 9)
        _, err = hold.communicate(timeout=30)
    assert "setproctitle is not installed" in err


def test_the_archive_is_pure_python_and_reproducible():
    a, b = build(), build()
    assert a.sha256 == b.sha256
    assert set(a.included) | set(a.missing) == set(BUNDLED) and "rich" in a.included
    with zipfile.ZipFile(io.BytesIO(a.data)) as z:
        names = z.namelist()
    assert not [n for n in names if n.endswith((".pyc", ".so")) or "__pycache__" in n]
    assert not [n for n in names if n.startswith(("setproctitle", "aiohttp", "matplotlib"))]


@given(st.tuples(st.integers(0, 99), st.integers(0, 99), st.integers(0, 99)))
def test_python_version_line(v):
    assert parse_python_version("Python {}.{}.{}\n/usr/bin/python3\n".format(*v)) == v
    assert parse_python_version("Python {}.{}\n".format(*v[:2])) == (v[0], v[1], 0)


@given(st.text(max_size=40))
def test_prefix_is_absolute_or_home(prefix):
    ok = (prefix.startswith(("/", "~/")) or prefix == "~") and prefix.isprintable()
    if ok:
        assert check_prefix(prefix) == prefix
    else:
        with pytest.raises(UsageError):
            check_prefix(prefix)
