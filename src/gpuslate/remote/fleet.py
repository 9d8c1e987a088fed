"""Run one gpuslate command on many hosts: in parallel (bounded) or host by host.

The wire contract is the command's own ``--json`` document: the remote side
runs ``gpuslate COMMAND ARGS... --json``; here its ``schema`` version is
checked and a failure is named (see :mod:`gpuslate.errors`: unreachable,
authentication refused, host key changed, gpuslate missing, timed out,
command failed, incompatible). One slow or broken host never blocks or hides
the others: each runs in its own thread and ssh's connect timeout bounds it.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

from .._document import parse_json
from ..errors import BadDocument, GpuslateError, GpuslateMissing, NotRun, RemoteCommandFailed, RemoteIncompatible
from .hosts import HostSpec
from .smi import SEPARATOR, smi_apps_words, smi_words, status_from_smi
from .ssh import (
    DEFAULT_REMOTE_COMMAND,
    INSTALL_HINT,
    INSTALLED_LAUNCHER,
    SshOptions,
    SshResult,
    missing,
    remote_line,
    run_ssh,
    transport_error,
)

SCHEMA = "gpuslate.fleet.v1"
ERROR_SCHEMA = "gpuslate.error.v1"
#: the schema version of every document this gpuslate understands
SUPPORTED_VERSION = 1
DEFAULT_PARALLEL = 32
_SCHEMA = re.compile(r"gpuslate\.([a-z0-9_.]+)\.v(\d+)")


class HostOutcome(NamedTuple):
    """What one host gave: its document (``result``) and/or the named failure."""

    host: HostSpec
    result: dict[str, Any] | None
    error: GpuslateError | None
    elapsed_s: float

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_json(self, exit_code: int) -> dict[str, Any]:
        err = None if self.error is None else {"type": self.error.code, "message": self.error.message,
                                               "hint": self.error.hint}
        return {"host": self.host.label, "ok": self.ok, "exit_code": exit_code, "error": err,
                "result": self.result, "elapsed_s": round(self.elapsed_s, 4)}


class FleetResult(NamedTuple):
    command: list[str]
    hosts: list[HostOutcome]

    def to_json(self, exit_code_of: Callable[[HostOutcome], int]) -> dict[str, Any]:
        return {"schema": SCHEMA, "command": self.command,
                "hosts": [h.to_json(exit_code_of(h)) for h in self.hosts]}


def schema_problem(schema: object) -> str | None:
    """Why a document's ``schema`` is not one this gpuslate reads, or None."""
    m = _SCHEMA.fullmatch(schema) if isinstance(schema, str) else None
    if m is None:
        return f"not a gpuslate document (schema {schema!r})"
    version = int(m.group(2))
    if version > SUPPORTED_VERSION:
        return (f"the remote gpuslate is newer: it sent {schema}, this gpuslate understands "
                f"v{SUPPORTED_VERSION} documents; upgrade the local gpuslate")
    if version < SUPPORTED_VERSION:
        return (f"the remote gpuslate is older: it sent {schema}, this gpuslate understands "
                f"v{SUPPORTED_VERSION} documents; upgrade gpuslate on that host")
    return None


_JSON_TYPES = {type(None): "null", bool: "boolean", int: "number", float: "number", str: "string", list: "array"}


def _document(stdout: str) -> tuple[dict[str, Any] | None, str | None]:
    """(the document, why there is none): parsed within the bounds of :func:`parse_json` (size,
    depth, numbers, UTF-8); a value that is not an object (``null``, a list) is no document."""
    if not stdout.strip():
        return None, None
    try:
        doc = parse_json(stdout)
    except BadDocument as exc:
        return None, str(exc)
    if not isinstance(doc, dict):
        return None, f"not a gpuslate document: a JSON {_JSON_TYPES.get(type(doc), 'value')}, not an object"
    return doc, None


def _detail(stderr: str) -> str:
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("gpuslate: error:")]
    return (errors or lines or [""])[-1].removeprefix("gpuslate: error: ")


def interpret(host: HostSpec, res: SshResult, opts: SshOptions
              ) -> tuple[dict[str, Any] | None, GpuslateError | None]:
    """The document and/or named failure of one ssh run (pure: no I/O)."""
    failed = transport_error(res, host, opts)
    if failed is not None:
        return None, failed
    label, rc, detail = host.label, res.returncode, _detail(res.stderr)
    doc, why = _document(res.stdout)
    if doc is None:
        if re.search(r"invalid choice|unrecognized arguments", detail):
            return None, RemoteIncompatible(f"{label}: the remote gpuslate does not understand this command "
                                            f"(older than this one?): {detail}",
                                            hint="upgrade gpuslate on that host")
        if why is not None and (rc == 0 or not detail):  # it answered, with something that is no document
            return None, BadDocument(f"{label}: {why}")
        return None, RemoteCommandFailed(f"{label}: {detail or f'exit {rc} without a JSON document'}",
                                         exit_code=rc if rc else 1)
    problem = schema_problem(doc.get("schema"))
    if problem is not None:
        return None, RemoteIncompatible(f"{label}: {problem}")
    if doc["schema"] == ERROR_SCHEMA:
        e: dict[str, Any] = doc["error"] if isinstance(doc.get("error"), dict) else {}
        code = e.get("exit_code") if isinstance(e.get("exit_code"), int) else rc
        return None, RemoteCommandFailed(f"{label}: {e.get('message') or detail}", exit_code=code or 1,
                                         hint=e.get("hint") if isinstance(e.get("hint"), str) else None)
    if rc != 0:
        return doc, RemoteCommandFailed(f"{label}: {detail or f'exit {rc}'}", exit_code=rc)
    return doc, None


def run_on_host(host: HostSpec, words: Sequence[str], opts: SshOptions, *, fallback_status: bool = False,
                timeout: float | None = None) -> HostOutcome:
    """``gpuslate WORDS`` on one host. Without ``GPUSLATE_REMOTE_COMMAND``, a host whose PATH has no
    ``gpuslate`` is tried again with the launcher ``install`` writes (``~/.local/bin/gpuslate``).
    ``fallback_status``: where gpuslate is missing, read the GPUs with nvidia-smi instead
    (read-only ``status`` only). What the host sends is bounded (size, depth: :func:`interpret`)
    and so is its time, ``timeout`` seconds for each ssh run (None: the command's own limits and
    ssh's keep-alive only); a host past a bound fails with the reason."""
    start = time.monotonic()
    res = run_ssh(host, remote_line([*opts.remote_command, *words]), opts, timeout=timeout)
    if opts.remote_command == DEFAULT_REMOTE_COMMAND and res.returncode == 127 and missing(res):
        res = run_ssh(host, f"{INSTALLED_LAUNCHER} {remote_line(words)}", opts, timeout=timeout)
    doc, err = interpret(host, res, opts)
    if isinstance(err, GpuslateMissing) and fallback_status:
        doc, err = _smi_status(host, opts, err, timeout)
    return HostOutcome(host, doc, err, time.monotonic() - start)


def _smi_status(host: HostSpec, opts: SshOptions, missing: GpuslateMissing, timeout: float | None
                ) -> tuple[dict[str, Any] | None, GpuslateError | None]:
    # constants only: each word quoted, joined by our own separators
    line = f"{remote_line(smi_words())} && {remote_line(['echo', SEPARATOR])} && {remote_line(smi_apps_words())}"
    taken_at = time.time()
    res = run_ssh(host, line, opts, timeout=timeout)
    failed = transport_error(res, host, opts) if res.too_large or res.stalled is not None else None
    if failed is not None:
        return None, failed
    if res.returncode != 0:
        return None, missing  # no nvidia-smi either: the missing-gpuslate message stands
    warning = f"gpuslate is not installed on {host.label}: a read-only view from nvidia-smi; {INSTALL_HINT}"
    text = res.stdout.encode("utf-8", "surrogateescape").decode("utf-8", "replace")  # CSV: shown, not parsed
    return status_from_smi(host.label, text, taken_at, warning), None


def run_parallel(hosts: Sequence[HostSpec], words: Sequence[str], opts: SshOptions, *,
                 parallel: int = DEFAULT_PARALLEL, on_done: Callable[[HostOutcome], None] | None = None,
                 fallback_status: bool = False,
                 run_one: Callable[[HostSpec, Sequence[str]], HostOutcome] | None = None,
                 timeout: float | None = None) -> FleetResult:
    """Every host at once, at most ``parallel`` at a time; results in host order.
    ``run_one`` runs one host (default: ``gpuslate WORDS`` over ssh; ``install`` passes its own);
    ``timeout``: the seconds each host's answer may take (see :func:`run_on_host`)."""

    def one(h: HostSpec) -> HostOutcome:
        out = (run_one(h, words) if run_one is not None else
               run_on_host(h, words, opts, fallback_status=fallback_status, timeout=timeout))
        if on_done is not None:
            on_done(out)
        return out

    with ThreadPoolExecutor(max_workers=max(1, min(parallel, len(hosts)))) as pool:
        outcomes = list(pool.map(one, hosts))
    return FleetResult(list(words), outcomes)


def run_sequential(hosts: Sequence[HostSpec], words: Sequence[str], opts: SshOptions, *,
                   keep_going: bool = False, on_done: Callable[[HostOutcome], None] | None = None,
                   run_one: Callable[[HostSpec, Sequence[str]], HostOutcome] | None = None,
                   timeout: float | None = None) -> FleetResult:
    """Host by host; after the first failure the rest are not run unless ``keep_going``.
    ``run_one`` runs one host (default: over ssh; :mod:`.srun` passes its own)."""
    outcomes: list[HostOutcome] = []
    failed: HostOutcome | None = None
    for h in hosts:
        if failed is not None and not keep_going:
            out = HostOutcome(h, None, NotRun(f"{h.label}: not run: {failed.host.label} failed first",
                                              hint="--keep-going runs every host"), 0.0)
        else:
            out = run_one(h, words) if run_one is not None else run_on_host(h, words, opts, timeout=timeout)
            if not out.ok and failed is None:
                failed = out
        if on_done is not None:
            on_done(out)
        outcomes.append(out)
    return FleetResult(list(words), outcomes)
