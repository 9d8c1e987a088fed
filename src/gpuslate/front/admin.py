"""Caddy's admin API over its Unix socket: bounded in time and size, every answer checked.

The admin socket is Caddy's (mode 0200, in the front's private folder); what it answers is
still read as a peer's document: at most :data:`MAX_BODY` bytes, within a timeout, JSON checked
for the types used.
"""

from __future__ import annotations

import http.client
import json
import socket
from typing import Any

MAX_BODY = 1 << 20
TIMEOUT_S = 5.0


class AdminError(OSError):
    """The admin API could not be reached, or answered what it should not."""


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        try:
            s.connect(self._path)
        except OSError:
            s.close()
            raise
        self.sock = s


class Admin:
    """One Caddy process's admin API, at the Unix socket ``path``."""

    def __init__(self, path: str, timeout: float = TIMEOUT_S) -> None:
        self.path = path
        self.timeout = timeout

    def request(self, method: str, url: str, body: bytes | None = None) -> tuple[int, bytes]:
        conn = _UnixConnection(self.path, self.timeout)
        try:
            headers = {"Content-Type": "application/json"} if body is not None else {}
            conn.request(method, url, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read(MAX_BODY + 1)
            if len(data) > MAX_BODY:
                raise AdminError(f"{self.path}: {url} answered more than {MAX_BODY} bytes")
            return resp.status, data
        except (OSError, http.client.HTTPException) as exc:
            if isinstance(exc, AdminError):
                raise
            raise AdminError(f"Caddy's admin socket {self.path}: {exc}") from None
        finally:
            conn.close()

    def get_json(self, url: str) -> Any:
        status, data = self.request("GET", url)
        if status != 200:
            raise AdminError(f"{self.path}: GET {url} answered {status}: {data[:200]!r}")
        try:
            return json.loads(data)
        except ValueError:
            raise AdminError(f"{self.path}: GET {url} answered no JSON") from None

    def get_text(self, url: str) -> str:
        status, data = self.request("GET", url)
        if status != 200:
            raise AdminError(f"{self.path}: GET {url} answered {status}")
        return data.decode("utf-8", "replace")

    def load(self, config: dict[str, Any]) -> None:
        """Replace the running configuration (``POST /load``); returns once it runs (Caddy
        stops the old one's servers in the background)."""
        status, data = self.request("POST", "/load", json.dumps(config).encode())
        if status != 200:
            raise AdminError(f"{self.path}: the configuration was refused ({status}): "
                             f"{data[:300].decode('utf-8', 'replace')}")

    def config(self) -> Any:
        return self.get_json("/config/")

    def alive(self) -> bool:
        try:
            self.request("GET", "/config/")
        except AdminError:
            return False
        return True
