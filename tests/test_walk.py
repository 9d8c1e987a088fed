"""The trusted-root walk as the one way to open a path gpuslate was given (issue 25): files named on
the command line (:func:`read_file`), a folder's sub-folders through links (``subdir``), and the
bounded read. Real folders, links and FIFOs; another user's links are root's links handed over with
lchown (no user needed)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from gpuslate._walk import StateDir, Trust, open_dir, open_file_dir, read_file
from gpuslate.errors import PermissionDenied

OTHER = 54321
ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="needs root to hand a link to another uid")


def theirs(path: Path) -> Path:
    os.chown(path, OTHER, OTHER, follow_symlinks=False)
    return path


def test_read_file_reads_a_regular_file_through_our_own_links(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "f.ini").write_text("gpu-a\n")
    (tmp_path / "dirlink").symlink_to("real")
    (tmp_path / "filelink").symlink_to("dirlink/f.ini")
    (tmp_path / "abs").symlink_to(tmp_path / "filelink")
    for name in ("real/f.ini", "dirlink/f.ini", "filelink", "abs"):
        assert read_file(tmp_path / name, limit=100) == b"gpu-a\n", name


@needs_root
@pytest.mark.parametrize("where", ["file", "folder"])
def test_read_file_refuses_another_users_link(tmp_path, where):
    (tmp_path / "f").write_text("x")
    link = tmp_path / "link"
    if where == "file":
        link.symlink_to(tmp_path / "f")
        target = link
    else:
        link.symlink_to(tmp_path)
        target = link / "f"
    theirs(link)
    with pytest.raises(PermissionDenied, match="symbolic link owned by uid 54321"):
        read_file(target, limit=100)


@pytest.mark.parametrize("shape", ["fifo", "dev-zero", "folder", "too-large"])
def test_read_file_never_hangs_never_reads_without_end(tmp_path, shape):
    path = tmp_path / "f"
    if shape == "fifo":
        os.mkfifo(path)
    elif shape == "dev-zero":
        path.symlink_to("/dev/zero")
    elif shape == "folder":
        path.mkdir()
    else:
        path.write_bytes(b"x" * 1001)
    t0 = time.monotonic()
    with pytest.raises(PermissionDenied) as ei:
        read_file(path, limit=1000)
    assert time.monotonic() - t0 < 5
    assert {"fifo": "a FIFO", "dev-zero": "a character device", "folder": "a directory",
            "too-large": "larger than 1000 bytes"}[shape] in str(ei.value)


def test_read_file_bounds_a_loop_of_links(tmp_path):
    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("a")
    with pytest.raises(PermissionDenied, match="too many symbolic links"):
        read_file(tmp_path / "a", limit=10)
    with pytest.raises(FileNotFoundError):
        read_file(tmp_path / "missing", limit=10)


def test_a_subdir_through_absolute_and_relative_links_is_the_kernels_folder(tmp_path):
    """An absolute link's target is walked from /, a relative '..' from the real parent (it was walked
    inside the starting folder, and created there with create=True)."""
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "mark").write_text("")
    top = tmp_path / "top"
    top.mkdir()
    (top / "abs").symlink_to(tmp_path / "elsewhere")
    (top / "rel").symlink_to("../elsewhere")
    with open_dir(top, trust=Trust.SHARED) as d:
        for name in ("abs", "rel"):
            with d.subdir(name, create=True) as sub:
                assert sub.real_path() == os.path.realpath(top / name) and sub.names() == ["mark"]
    assert sorted(p.name for p in top.iterdir()) == ["abs", "rel"]  # nothing made inside top


def test_create_unlink_and_real_path_stay_in_the_walked_folder(tmp_path):
    with open_dir(tmp_path, trust=Trust.SHARED) as d:
        fd = d.create("new", os.O_WRONLY, 0o640)
        assert fd is not None
        os.close(fd)
        assert oct((tmp_path / "new").stat().st_mode & 0o777) == "0o640"
        (tmp_path / "link").symlink_to("new")
        assert d.create("link") is None and d.create("new") is None  # something is there: nothing opened
        d.unlink("link")  # the link goes, never what it points to
        assert (tmp_path / "new").exists() and not (tmp_path / "link").exists()
        assert d.real_path() == os.path.realpath(tmp_path)
        with pytest.raises(PermissionDenied):
            d.unlink("../new")


def test_open_file_dir_gives_the_folder_and_a_name_to_open_in_it(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "x").write_text("1")
    (tmp_path / "ln").symlink_to("sub/x")
    folder, name = open_file_dir(tmp_path / "ln", what="unit file")
    with folder:
        assert isinstance(folder, StateDir) and name == "x" and folder.read(name, 10) == b"1"
    with pytest.raises(PermissionDenied, match="names a folder"):
        open_file_dir(tmp_path / "sub" / "..")


@pytest.mark.parametrize("path", ["\0", "/tmp/a\0b", "relative\0"])
def test_a_path_holding_a_nul_byte_is_bad_input(path: str) -> None:
    """Found by the CLI fuzzer (``status --sim '\\0'`` was a ValueError, exit 1): one line, exit 2."""
    from gpuslate.cli.main import main
    from gpuslate.errors import UsageError

    for walk in (open_dir, open_file_dir):
        with pytest.raises(UsageError, match="cannot hold a NUL byte"):
            walk(path)
    assert main(["status", "--sim", path]) == 2
