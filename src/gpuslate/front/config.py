"""The Caddy configurations of a front: two Caddy processes, each steered through its admin API.

* The **front** process listens where clients connect (``127.0.0.1:PORT`` unless told
  otherwise) and proxies every request to one Unix socket, the *route socket*. Its
  configuration never changes while it runs: a config load cancels the retry loop of every
  request the old configuration holds (``LoadBalancing.tryAgain`` returns on the old handler's
  context, which the load cancels: caddy ``modules/caddyhttp/reverseproxy/reverseproxy.go``),
  so the requests it holds must never see one. It holds a request for as long as the route
  socket refuses it (``try_duration``, retrying every ``try_interval``): a dial error is
  always retried, whatever the method. Connections to the route socket are not kept alive, so
  no request is ever written to a connection the route is closing; a request whose connection
  was reset before any answer (one accepted by a route closing that very moment) is retried
  too (``retry_match`` on every method), its body replayed from a buffer (``request_buffers``).
* The **route** process listens on the route socket and proxies to the unit's own address.
  Loading the *hold* configuration (no server) closes the route socket: the front holds new
  requests, while the requests already through finish on the old unit (Caddy shuts the old
  server down gracefully, with no grace-period bound, in the background). Loading a route to
  the next unit opens it again. A config load of the route process holds no request.

Neither process is reachable from another host except at the front's own listen address:
both admin APIs are Unix sockets (mode 0200, made by Caddy) in a private folder, and the
route's upstream is the unit's address, fixed in the configuration (no placeholder, no Host
header, decides where a request goes: the front is no open proxy).
"""

from __future__ import annotations

import json
from typing import Any

from .._parse import format_front

#: how often a held request tries the route socket again: held requests are let through in the
#: order they arrived to within this
TRY_INTERVAL_S = 0.005
#: the most bytes of a request body kept to replay it after a reset (larger bodies are streamed)
REQUEST_BUFFER = 4 << 20
#: every method, so that a request reset before any answer is retried, not only a GET
_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


def _admin(sock: str) -> dict[str, Any]:
    # persist false: Caddy would otherwise save every config it loads in the user's home
    return {"listen": f"unix/{sock}", "config": {"persist": False}}


def _logging() -> dict[str, Any]:
    return {"logs": {"default": {"level": "WARN"}}}


def _server(listen: str) -> dict[str, Any]:
    return {"listen": [listen], "protocols": ["h1"], "automatic_https": {"disable": True}}


def front_config(*, host: str, port: int, admin: str, route: str, hold_s: float) -> dict[str, Any]:
    """The front process's configuration: ``host:port`` -> the route socket, holding a request up
    to ``hold_s`` seconds while the route socket refuses it."""
    proxy = {
        "handler": "reverse_proxy",
        "upstreams": [{"dial": f"unix/{route}"}],
        "flush_interval": -1,  # streams pass through chunk by chunk
        "transport": {"protocol": "http", "keep_alive": {"enabled": False}},
        "request_buffers": REQUEST_BUFFER,
        "load_balancing": {"try_duration": f"{hold_s:g}s", "try_interval": f"{TRY_INTERVAL_S * 1000:g}ms",
                           "retry_match": [{"method": _METHODS}]},
    }
    server = {**_server(format_front(host, port)), "routes": [{"handle": [proxy]}]}
    return {"admin": _admin(admin), "logging": _logging(),
            "apps": {"http": {"metrics": {}, "servers": {"front": server}}}}


def route_config(*, admin: str, route: str, upstream: str) -> dict[str, Any]:
    """The route process serving ``upstream`` (``HOST:PORT``, the unit's address) on the route socket."""
    proxy = {"handler": "reverse_proxy", "upstreams": [{"dial": upstream}], "flush_interval": -1}
    server = {**_server(f"unix/{route}"), "routes": [{"handle": [proxy]}]}
    return {"admin": _admin(admin), "logging": _logging(), "apps": {"http": {"servers": {"route": server}}}}


def hold_config(*, admin: str) -> dict[str, Any]:
    """The route process holding: no server, so the route socket is closed and the front holds."""
    return {"admin": _admin(admin), "logging": _logging()}


def refuse_config(*, admin: str, route: str, reason: str) -> dict[str, Any]:
    """The route process answering 503 at once with ``reason``: no unit serves the front (a swap
    that could not finish), and holding requests for nothing would only hide it."""
    body = json.dumps({"error": {"message": f"gpuslate front: {reason}", "type": "service_unavailable",
                                 "code": 503}})
    answer = {"handler": "static_response", "status_code": 503, "body": body,
              "headers": {"Content-Type": ["application/json"], "Retry-After": ["5"]}}
    server = {**_server(f"unix/{route}"), "routes": [{"handle": [answer]}]}
    return {"admin": _admin(admin), "logging": _logging(), "apps": {"http": {"servers": {"route": server}}}}


def routed_upstream(config: Any) -> tuple[str, str | None]:
    """What a route process's configuration (as its admin API returns it) does:
    ``("route", "HOST:PORT")``, ``("hold", None)`` or ``("refuse", reason)``; ``("unknown", None)``
    for anything else (a configuration gpuslate did not make)."""
    try:
        servers = (config.get("apps") or {}).get("http", {}).get("servers") or {} if isinstance(config, dict) else None
        if servers is None:
            return "unknown", None
        if not servers:
            return "hold", None
        handle = servers["route"]["routes"][0]["handle"][0]
        if handle.get("handler") == "reverse_proxy":
            dial = handle["upstreams"][0]["dial"]
            return ("route", dial) if isinstance(dial, str) else ("unknown", None)
        if handle.get("handler") == "static_response":
            msg = json.loads(handle.get("body", "{}")).get("error", {}).get("message", "")
            return "refuse", str(msg).removeprefix("gpuslate front: ")
    except (KeyError, IndexError, TypeError, AttributeError, ValueError):
        pass
    return "unknown", None
