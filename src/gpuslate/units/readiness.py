"""Is the unit serving yet? One probe per readiness kind, and the optional smoke completion.

Each probe is one cheap, bounded attempt; :mod:`.lifecycle` calls it in a loop
that also watches for the process dying, so a crash is seen at once rather
than at the start timeout.

* an engine's name (``gpuslate.engines``): every path of its readiness
  answers 200, in order (SGLang ``GET /health_generate``, which runs a real
  1-token generation; vLLM and TensorRT-LLM ``GET /health`` then ``GET /v1/models``);
* ``http``: ``GET URL`` is 200;
* ``log``: a line of the unit's log matches a regular expression;
* ``tcp``: a TCP connection to the port is accepted.
"""

from __future__ import annotations

import json
import re
import socket
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from .._document import parse_json
from ..engines.registry import BACKENDS
from .spec import UnitSpec

#: an answer to a readiness probe or the smoke completion is small; one larger is cut off, never read whole
MAX_ANSWER_BYTES = 1 << 20


def http(method: str, url: str, *, body: dict[str, Any] | None = None, timeout: float = 2.0) -> tuple[int, bytes]:
    """One HTTP request, bounded: ``timeout`` seconds in all (a server that trickles its answer
    byte by byte is not waited for longer), at most :data:`MAX_ANSWER_BYTES` of body read (more is
    cut off: a probe only needs the status, the smoke test a small document). Raises OSError when
    nothing answers, or not in time."""
    import http.client  # lazy: startup

    deadline = time.monotonic() + max(0.05, timeout)
    u = urlsplit(url)
    cls = http.client.HTTPSConnection if u.scheme == "https" else http.client.HTTPConnection
    conn = cls(u.hostname or "127.0.0.1", u.port, timeout=max(0.05, timeout))
    try:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"} if data is not None else {}
        conn.request(method, (u.path or "/") + (f"?{u.query}" if u.query else ""), body=data, headers=headers)
        resp = conn.getresponse()
        got = bytearray()
        while len(got) <= MAX_ANSWER_BYTES:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no whole answer within {timeout:g} s")
            if conn.sock is not None:
                conn.sock.settimeout(left)
            chunk = resp.read1(1 << 16)
            if not chunk:
                break
            got += chunk
        return resp.status, bytes(got[:MAX_ANSWER_BYTES + 1])
    except http.client.HTTPException as exc:
        raise OSError(str(exc)) from None
    finally:
        conn.close()


class Probe:
    """The readiness check of one unit run."""

    def __init__(self, spec: UnitSpec, log: Path) -> None:
        self.spec = spec
        self.kind, self.target = spec.readiness
        self.detail = "not checked yet"
        self._log_path = log
        self._pos = 0
        self._partial = b""
        self._pattern = re.compile(spec.ready_log) if spec.ready_log else None

    def check(self, timeout: float = 2.0) -> bool:
        try:
            if self.kind in BACKENDS:
                return self._engine(timeout)
            ready: bool = getattr(self, f"_{self.kind}")(timeout)
            return ready
        except OSError as exc:  # refused, reset, timed out: still starting
            self.detail = f"{self.target}: {exc.strerror or exc}"
            return False

    def _status(self, url: str, timeout: float) -> bool:
        status, _ = http("GET", url, timeout=timeout)
        self.detail = f"{url}: HTTP {status}"
        return status == 200

    def _tcp(self, timeout: float) -> bool:
        with socket.create_connection((self.spec.ready_host, int(self.spec.port or 0)), timeout=min(timeout, 1.0)):
            # the weakest check (most servers bind before they load): say so where it is shown
            self.detail = (f"{self.target}: accepting connections (the port only, not that it serves: "
                           "--engine, --ready or --ready-log check that)")
            return True

    def _http(self, timeout: float) -> bool:
        return self._status(self.target, timeout)

    def _engine(self, timeout: float) -> bool:
        return all(self._status(self.spec.url(path), timeout) for path in BACKENDS[self.kind].readiness.paths)

    def _log(self, timeout: float) -> bool:
        assert self._pattern is not None
        with open(self._log_path, "rb") as f:  # the unit's own log, made by this run (units/logfile.py)
            f.seek(self._pos)
            chunk = f.read(MAX_ANSWER_BYTES * 4)  # what a probe reads at once: the rest at the next one
        self._pos += len(chunk)
        lines = (self._partial + chunk).split(b"\n")
        self._partial = lines.pop()[-(1 << 16):]  # a line without end is matched by its last 64 KiB
        for line in lines:
            if self._pattern.search(line.decode("utf-8", "replace")):
                self.detail = f"log line matched: {line.decode('utf-8', 'replace').strip()[:200]}"
                return True
        self.detail = f"no log line matches {self.target!r} yet"
        return False


def smoke(spec: UnitSpec, timeout: float = 60.0) -> dict[str, Any]:
    """One real 1-token completion (OpenAI API). Never raises; ``ok`` says how it went."""
    t0 = time.monotonic()
    out: dict[str, Any] = {"ok": False, "model": spec.model, "status": None, "latency_s": None, "error": None}
    try:
        model = spec.model
        if model is None:
            status, body = http("GET", spec.url("/v1/models"), timeout=timeout)
            models = parse_json(body).get("data") or [] if status == 200 else []
            if not models:
                out["error"] = f"/v1/models answered HTTP {status} with no model"
                return out
            model = out["model"] = models[0]["id"]
        status, body = http("POST", spec.url("/v1/completions"), timeout=max(0.1, timeout - (time.monotonic() - t0)),
                            body={"model": model, "prompt": "Hello", "max_tokens": 1, "temperature": 0})
        out["status"] = status
        if status != 200:
            out["error"] = f"/v1/completions answered HTTP {status}: {body[:200].decode('utf-8', 'replace')}"
            return out
        doc = parse_json(body)
        if not doc.get("choices"):
            out["error"] = "/v1/completions returned no choices"
            return out
        out["ok"] = True
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        out["error"] = f"smoke completion failed: {exc}"
    finally:
        out["latency_s"] = round(time.monotonic() - t0, 4)
    return out
