"""The audit log: one JSON line for every signal gpuslate sends, and one for its outcome.

The signal line is on disk (fsync) before the signal goes out, so even a run
killed between the two leaves a record; such an entry reads back with
``"outcome": None``.

Several gpuslate processes may append to one file at once. Each entry is one
complete line written by one ``os.write`` on an ``O_APPEND`` descriptor while
holding ``flock``, so lines never interleave. A reader takes no lock: it skips
a line it cannot parse (a torn write from a crashed writer, or one in flight).

The log's folder is reached by host/statedir.py's checked walk once per
``AuditLog`` and held open; each write opens the log relative to it, and only
if it is a regular file of ours with one link (a FIFO, a link or another
user's file is refused: no signal is then sent).

The ``audit`` verb reads it back (host/auditlist.py: apart, so that ``clear``, which writes the
log, does not load the listing's document types).
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ..errors import PermissionDenied, UsageError
from ..gpu import sim_root_from_env
from .statedir import StateDir, open_dir, open_state_dir

OUTCOMES = ("delivered", "not_running", "pid_reused", "permission_denied", "refused", "error")

_BLOCK = 64 * 1024


def new_run_id() -> str:
    """A run id that sorts by start time and is unique across hosts and processes."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + os.urandom(4).hex()


def _new_entry_id() -> str:
    return os.urandom(8).hex()


class AuditLog:
    """Append-only JSON-lines log of signals, by default ``state_dir(sim_root)/audit.jsonl``.

    ``backend`` (``nvml`` or ``sim``) and ``sim_root`` go into every entry, with
    the host name, so that an entry says which GPUs it was about; without them,
    the backend ``open_backend()`` would choose (``$GPUSLATE_SIM``, else NVML).
    ``context`` (e.g. ``{"slurm_job": 42}``, from a Slurm epilog) goes into
    every signal entry as ``"context"`` when given.
    """

    def __init__(self, path: Path | None = None, *, backend: str | None = None,
                 sim_root: str | os.PathLike[str] | None = None, context: dict[str, Any] | None = None) -> None:
        if backend is None:  # as open_backend() chooses: the simulated host of $GPUSLATE_SIM, else NVML
            sim_root = sim_root or sim_root_from_env()
            backend = "sim" if sim_root else "nvml"
        # The folder is walked and checked once (host/statedir.py) and held open: every
        # append opens the log relative to it, so a folder swapped between two
        # signal phases is never written.
        self._dir: StateDir | None = None
        if path is None:
            self._dir = open_state_dir(sim_root)  # an unsafe state folder refuses before any plan acts
            path = self._dir.path / "audit.jsonl"
        self.path = Path(path)
        self.backend = backend
        self.sim_root = str(Path(sim_root).absolute()) if sim_root and backend == "sim" else None
        self.context = dict(context) if context else None
        self._actor: dict[str, Any] | None = None
        self._host: str | None = None

    # -- writing ---------------------------------------------------------------

    def before_signal(self, *, run_id: str, action: str, signal: str, target: dict[str, Any],
                      reason: str | None = None) -> str:
        """Record a signal about to be sent; durable on disk when this returns.

        Returns the entry id to pass to :meth:`outcome`. Raises
        :class:`PermissionDenied` when the entry cannot be written: the caller
        must then not send the signal.
        """
        return self.before_signals(run_id=run_id, action=action, signal=signal, targets=[target],
                                   reason=reason)[0]

    def before_signals(self, *, run_id: str, action: str, signal: str, targets: list[dict[str, Any]],
                       reason: str | None = None) -> list[str]:
        """:meth:`before_signal` for several targets at once: one write and one
        fsync for all their lines (a job of nine processes is signaled after one
        disk flush, not nine), each line still on disk before any signal goes out."""
        ids = [_new_entry_id() for _ in targets]
        host, actor = self._hostname(), self._actor_info()
        self._append(lambda now: [{
            "event": "signal", "id": entry_id, "run_id": run_id, "action": action,
            "time": now, "host": host, "backend": self.backend, "sim": self.sim_root,
            "actor": actor, "signal": signal, "target": target, "reason": reason,
            **({"context": self.context} if self.context else {}),
        } for entry_id, target in zip(ids, targets)], durable=True)
        return ids

    def outcome(self, entry_id: str, outcome: str, detail: str | None = None) -> None:
        """Record what became of a signal recorded by :meth:`before_signal`."""
        self.outcomes([(entry_id, outcome, detail)])

    def outcomes(self, results: list[tuple[str, str, str | None]]) -> None:
        """:meth:`outcome` for several signals: (entry id, outcome, detail) each, one write."""
        for _, outcome, _ in results:
            if outcome not in OUTCOMES:
                raise UsageError(f"invalid audit outcome {outcome!r}: expected one of {', '.join(OUTCOMES)}")
        # No fsync of its own: losing it to a power cut reads back as "interrupted",
        # which is honest, and the next before_signal's fsync flushes it anyway.
        self._append(lambda now: [{"event": "outcome", "id": entry_id, "time": now, "outcome": outcome,
                                   "detail": detail} for entry_id, outcome, detail in results], durable=False)

    def _folder(self) -> StateDir:
        """The log's folder, held open (an explicit path's is walked on first use:
        ``FileNotFoundError`` when it does not exist)."""
        if self._dir is None:
            self._dir = open_dir(self.path.parent)
        return self._dir

    def _append(self, make: Callable[[str], list[dict[str, Any]]], *, durable: bool) -> None:
        from .._time import iso_time  # lazy: startup

        hint = "no signal was sent" if durable else None
        try:
            folder = self._folder()
            fd = folder.open(self.path.name, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
        except PermissionDenied as exc:  # a symlink, a FIFO, a folder another user could change
            raise PermissionDenied(f"cannot open the audit log {self.path}: {exc}", hint=hint) from None
        except OSError as exc:
            raise self._error("open", exc, durable) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            # The time is taken under the lock so that file order is time order,
            # which lets read(since=...) stop at the first older entry.
            lines = [json.dumps(e, separators=(",", ":"), default=str) for e in make(iso_time(time.time()))]
            data = "".join(line + "\n" for line in lines).encode("utf-8", "backslashreplace")
            # A writer that died mid-line left no newline: start on a fresh line
            # so that the torn fragment does not swallow this entry too.
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                data = b"\n" + data
            _write_all(fd, data)
            if durable:
                os.fsync(fd)
                if not size:  # a new file: its name must survive a crash too
                    _fsync_dir(folder.fd)
        except OSError as exc:
            raise self._error("write", exc, durable) from None
        finally:
            os.close(fd)  # closing drops the flock

    def _error(self, verb: str, exc: OSError, before_signal: bool) -> PermissionDenied:
        first = "no signal was sent" if before_signal else "the signal was sent but its outcome is not recorded"
        return PermissionDenied(f"cannot {verb} the audit log {self.path}: {exc.strerror or exc}",
                                hint=f"{first}; set GPUSLATE_STATE_DIR to a writable directory")

    def _hostname(self) -> str:
        if self._host is None:
            import socket  # lazy: startup; only when writing: keeps CLI start-up light

            self._host = socket.gethostname()
        return self._host

    def _actor_info(self) -> dict[str, Any]:
        if self._actor is None:
            from ..proc.procfs import user_name  # lazy: startup

            uid = os.getuid()
            self._actor = {
                "user": user_name(uid), "uid": uid, "pid": os.getpid(),
                "command": list(sys.argv),
                # root via sudo: who really asked for it
                "sudo_user": os.environ.get("SUDO_USER") if uid == 0 else None,
            }
        # pid may change if the caller forked after the first entry
        return {**self._actor, "pid": os.getpid()}

    # -- reading ---------------------------------------------------------------

    def read(self, *, limit: int | None = None, since: float | None = None,
             where: Callable[[dict[str, Any]], bool] | None = None) -> list[dict[str, Any]]:
        """Signal entries, oldest first, each merged with its outcome; only those
        ``where(entry)`` accepts when given (``limit`` counts those).

        Merged keys: ``outcome`` (``None`` when the run was interrupted before
        recording one), ``outcome_time`` and ``outcome_detail``. ``limit``
        keeps the newest N; ``since`` (epoch seconds) keeps entries at or
        after that time. With either, the file is read backwards from its end
        and only as far as needed.
        """
        if limit is not None and limit <= 0:
            return []
        since_iso: str | None = None
        if since is not None:
            from .._time import iso_time  # lazy: startup

            since_iso = iso_time(since)
        try:
            with os.fdopen(self._folder().open(self.path.name, os.O_RDONLY), "rb") as f:
                if limit is None and since_iso is None:
                    return [e for e in _merge_forward(f) if where is None or where(e)]
                return _merge_backward(f, limit, since_iso, where)
        except FileNotFoundError:
            return []
        except PermissionDenied:
            raise
        except OSError as exc:
            raise PermissionDenied(f"cannot read the audit log {self.path}: {exc.strerror or exc}") from None


def of_host(sim_root: str | None) -> Callable[[dict[str, Any]], bool]:
    """Entries about one backend: a simulated host's own (``sim_root``), or the driver's
    (``None``). Entries written before backends were recorded (no ``backend``) belong to every one."""

    def where(e: dict[str, Any]) -> bool:
        backend = e.get("backend")
        if backend is None:
            return True
        return e.get("sim") == sim_root if sim_root else backend != "sim"

    return where


def _write_all(fd: int, data: bytes) -> None:
    # One write in practice; a short write (disk nearly full) continues under the
    # same flock, so the line still cannot interleave with another writer's.
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _fsync_dir(dfd: int) -> None:
    try:
        os.fsync(dfd)
    except OSError:
        pass  # some filesystems refuse fsync on directories; the entry itself is synced


def _parse(line: str) -> dict[str, Any] | None:
    try:
        doc = json.loads(line)
    except ValueError:  # a torn or garbage line
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("id"), str):
        return None
    return doc


def _merged(entry: dict[str, Any], out: dict[str, Any] | None) -> dict[str, Any]:
    entry["outcome"] = out.get("outcome") if out else None
    entry["outcome_time"] = out.get("time") if out else None
    entry["outcome_detail"] = out.get("detail") if out else None
    return entry


def _merge_forward(f: Any) -> list[dict[str, Any]]:
    # one decode of the whole file: parsing str lines is much faster than bytes
    lines = f.read().decode("utf-8", "replace").split("\n")
    lines.pop()  # after the last newline: empty, or a line still being written
    signals: list[dict[str, Any]] = []
    outcomes: dict[str, dict[str, Any]] = {}
    for line in lines:
        doc = _parse(line)
        if doc is None:
            continue
        event = doc.get("event")
        if event == "signal":
            signals.append(doc)
        elif event == "outcome":
            outcomes[doc["id"]] = doc  # the last one recorded wins
    return [_merged(e, outcomes.get(e["id"])) for e in signals]


def _merge_backward(f: Any, limit: int | None, since_iso: str | None,
                    where: Callable[[dict[str, Any]], bool] | None = None) -> list[dict[str, Any]]:
    # An outcome is always written after its signal, so walking backwards meets
    # it first; the first outcome met for an id is the last one recorded.
    newest_first: list[dict[str, Any]] = []
    outcomes: dict[str, dict[str, Any]] = {}
    for line in _lines_backward(f):
        doc = _parse(line.decode("utf-8", "replace"))
        if doc is None:
            continue
        event = doc.get("event")
        if event == "outcome":
            outcomes.setdefault(doc["id"], doc)
        elif event == "signal":
            if since_iso is not None and str(doc.get("time", "")) < since_iso:
                break  # file order is time order (times are taken under the write lock)
            entry = _merged(doc, outcomes.pop(doc["id"], None))
            if where is not None and not where(entry):
                continue
            newest_first.append(entry)
            if limit is not None and len(newest_first) >= limit:
                break
    newest_first.reverse()
    return newest_first


def _lines_backward(f: Any) -> Iterator[bytes]:
    """Complete lines from the end of the file to its start (without newlines)."""
    pos = f.seek(0, os.SEEK_END)
    tail = b""
    at_end = True  # still inside the piece after the last newline: skipped
    while pos > 0:
        step = min(_BLOCK, pos)
        pos -= step
        f.seek(pos)
        parts = (f.read(step) + tail).split(b"\n")
        tail = parts.pop(0)  # may continue in the previous block
        if at_end:
            if not parts:  # no newline yet: all of it belongs to the skipped piece
                tail = b""
                continue
            parts.pop()  # empty, or a line still being written
            at_end = False
        yield from reversed(parts)
    if tail and not at_end:
        yield tail
