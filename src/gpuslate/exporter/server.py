"""The exporter's HTTP server: ``/metrics``, ``/healthz``, and where it may listen.

A threaded server from the standard library (one thread per connection, each
with a socket timeout, so a client that stalls holds one thread for at most
:data:`CLIENT_TIMEOUT` seconds), serving a private
:class:`~prometheus_client.CollectorRegistry`: no global registry state, so
nothing but the collector's series is exposed. ``/metrics`` answers in the
format the scraper asks for (Prometheus text, or OpenMetrics).

The metrics name processes, users and jobs: by default the server listens on
loopback only, and a non-loopback address must be asked for with
``allow_remote`` (``--allow-remote``): see :func:`parse_listen`.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from ..errors import UsageError
from . import DEFAULT_PORT

#: seconds a connection may stay silent before its thread gives up on it
CLIENT_TIMEOUT = 30.0
_INDEX = b"gpuslate exporter: metrics at /metrics, liveness at /healthz\n"


def parse_listen(text: str, *, allow_remote: bool = False) -> tuple[str, int]:
    """``ADDR:PORT`` (``[ADDR]:PORT`` for IPv6; ``localhost`` is 127.0.0.1) as (address, port).

    Port 0 picks a free port. A non-loopback address without ``allow_remote``
    is a :class:`UsageError`, as is anything that is not an IP address and a port.
    """
    host, sep, port_text = text.rpartition(":")
    if not sep or not host:
        raise UsageError(f"invalid --listen {text!r}: expected ADDR:PORT, e.g. 127.0.0.1:{DEFAULT_PORT}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if host == "localhost":
        host = "127.0.0.1"
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        raise UsageError(f"invalid --listen {text!r}: {host!r} is not an IP address "
                         f"(e.g. 127.0.0.1:{DEFAULT_PORT}, [::1]:{DEFAULT_PORT}, 0.0.0.0:{DEFAULT_PORT})") from None
    if not (port_text.isascii() and port_text.isdigit()) or len(port_text) > 5 or int(port_text) > 65535:
        raise UsageError(f"invalid --listen {text!r}: the port must be a number from 0 to 65535")
    if not addr.is_loopback and not allow_remote:
        raise UsageError(
            f"--listen {text}: {addr} is not a loopback address, and the metrics name processes, users "
            "and jobs", hint="add --allow-remote to serve them to the network (firewall the port)")
    return str(addr), int(port_text)


class _Server(ThreadingHTTPServer):
    daemon_threads = True  # a stalled client never delays the exit
    allow_reuse_address = True
    registry: CollectorRegistry


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    timeout = CLIENT_TIMEOUT
    server_version = "gpuslate-exporter"
    sys_version = ""

    def do_GET(self) -> None:  # the standard library's name
        self._answer(send_body=True)

    def do_HEAD(self) -> None:
        self._answer(send_body=False)

    def _answer(self, *, send_body: bool) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
            body = encoder(self.server.registry)
        elif path == "/healthz":
            body, content_type = b"ok\n", "text/plain; charset=utf-8"
        elif path == "/":
            body, content_type = _INDEX, "text/plain; charset=utf-8"
        else:
            body, content_type = b"not found: try /metrics\n", "text/plain; charset=utf-8"
            self.send_response(404)
            self._send(body, content_type, send_body)
            return
        self.send_response(200)
        self._send(body, content_type, send_body)

    def _send(self, body: bytes, content_type: str, send_body: bool) -> None:
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if send_body:
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # the standard library's name and signature
        pass  # one line per scrape on stderr is noise; errors show in gpuslate_exporter_scrape_errors_total


class MetricsServer:
    """Serves ``registry`` on ``address`` from a background thread until :meth:`close`."""

    def __init__(self, registry: CollectorRegistry, address: tuple[str, int]) -> None:
        host, port = address
        server_class = type("Server", (_Server,), {
            "address_family": socket.AF_INET6 if ":" in host else socket.AF_INET})
        try:
            self._server = server_class((host, port), _Handler)
        except OSError as exc:
            raise UsageError(f"cannot listen on {format_address((host, port))}: {exc.strerror or exc}",
                             hint="pick another --listen address or port") from None
        self._server.registry = registry
        self._thread = threading.Thread(target=self._server.serve_forever, name="gpuslate-exporter-http",
                                        daemon=True)

    @property
    def address(self) -> tuple[str, int]:
        """The bound (address, port): the port is the real one when 0 was asked for."""
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        """Stop serving and close the socket (requests in flight finish on their daemon threads)."""
        if self._thread.is_alive():
            self._server.shutdown()
        self._server.server_close()


def format_address(address: tuple[str, int]) -> str:
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
