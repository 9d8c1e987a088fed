"""The walk from a trusted root and the unit-name type, against their rules (hypothesis).

The walk is run on real folder chains with random owners, modes and links; what
it accepts must be exactly what the rule in host/statedir.py's docstring says:
every component ours or root's, every folder on the way writable by nobody else
unless sticky, the folder itself writable by nobody else at all.
"""

from __future__ import annotations

import os
import stat
import string
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuslate.errors import PermissionDenied, UsageError
from gpuslate.host.statedir import Trust, open_dir
from gpuslate.unitname import MAX_LENGTH, UnitName, is_unit_name

OTHER = 54321  # root can chown to any uid; no user needed
ROOT = os.geteuid() == 0
ALLOWED = set(string.ascii_letters + string.digits + "._-")

# -- the unit name ------------------------------------------------------------------


def oracle_name(text: str) -> bool:
    return (1 <= len(text) <= MAX_LENGTH and set(text) <= ALLOWED
            and text[0] in string.ascii_letters + string.digits)


names = st.one_of(st.text(max_size=80), st.text(alphabet=sorted(ALLOWED) + ["/", "\0", "\x1b", " "], max_size=70),
                  st.sampled_from(["..", ".", "-x", "../x", "a/../b", "web", "a" * 64, "a" * 65]))


@given(names)
def test_unit_name_accepts_exactly_its_rule(text: str) -> None:
    if oracle_name(text):
        name = UnitName(text)
        assert name == text and is_unit_name(text) and UnitName(name) is name
        # as a file name it is one component inside units/, never an option, never hidden
        for file in (f"{name}.json", f"{name}.log"):
            assert os.path.normpath(os.path.join("/units", file)) == "/units/" + file
        assert not name.startswith(("-", "."))
    else:
        assert not is_unit_name(text)
        with pytest.raises(UsageError) as ei:
            UnitName(text)
        msg = str(ei.value)
        # one line, nothing a terminal would act on, bounded whatever the input's length
        assert msg.isprintable() and len(msg) < 300 and msg.startswith("invalid unit name ")


# -- the walk -----------------------------------------------------------------------

MODES = [0o700, 0o755, 0o750, 0o775, 0o757, 0o777, 0o1777, 0o1775, 0o1755]
component = st.fixed_dictionaries({
    "mode": st.sampled_from(MODES),
    "other_owner": st.booleans() if ROOT else st.just(False),
    "link": st.sampled_from([None, "ours", "theirs"] if ROOT else [None, "ours"]),
})


def oracle_walk(chain: list[dict]) -> bool:
    """The rule, restated: may another user change what the path names (or the folder's contents)?"""
    for i, c in enumerate(chain):
        final = i == len(chain) - 1
        if c["link"] == "theirs" or c["other_owner"]:
            return False
        writable = c["mode"] & 0o022
        if writable and (final or not c["mode"] & stat.S_ISVTX):
            return False
    return True


def build(base: Path, chain: list[dict]) -> Path:
    """The chain as real folders under ``base`` (a link's folder lives in ``base/targets``)."""
    targets = base / "targets"
    targets.mkdir(mode=0o700)
    here = base / "walk"
    here.mkdir(mode=0o700)
    for i, c in enumerate(chain):
        here = here / f"c{i}"
        real = here if c["link"] is None else targets / f"t{i}"
        real.mkdir()
        if c["link"] is not None:
            here.symlink_to(real)
            if c["link"] == "theirs":
                os.chown(here, OTHER, -1, follow_symlinks=False)
            if i + 1 < len(chain):
                here = real  # the next component is made inside the target, reached through the link
        os.chmod(real, c["mode"])
        if c["other_owner"]:
            os.chown(real, OTHER, -1)
    return base / "walk" / "/".join(f"c{i}" for i in range(len(chain)))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(component, min_size=1, max_size=4))
def test_walk_accepts_exactly_the_rule(tmp_path: Path, chain: list[dict]) -> None:
    base = Path(tempfile.mkdtemp(dir=tmp_path))
    path = build(base, chain)
    try:
        open_dir(path).close()
        accepted = True
    except PermissionDenied:
        accepted = False
    assert accepted == oracle_walk(chain), (chain, path)
    # the shared rules (the lock folder) refuse only links another user owns
    try:
        open_dir(path, trust=Trust.SHARED, what="lock directory").close()
        shared = True
    except PermissionDenied:
        shared = False
    assert shared == all(c["link"] != "theirs" for c in chain)


def test_walk_never_creates_through_a_refused_component(tmp_path: Path) -> None:
    shared = tmp_path / "open"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(PermissionDenied, match="open is writable by group and others"):
        open_dir(shared / "a" / "b", create=True)
    assert list(shared.iterdir()) == []


def test_relative_paths_are_walked_from_the_working_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with open_dir("rel/state", create=True) as d:
        assert d.path == tmp_path / "rel" / "state"
        assert os.path.samestat(os.fstat(d.fd), os.stat(tmp_path / "rel" / "state"))
