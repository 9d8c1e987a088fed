"""The front's Caddy configurations and counters, as pure functions: what a route does, read back
from its configuration; the held/through arithmetic over Caddy's own documents; the version gate."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuslate._parse import format_front, parse_front
from gpuslate.errors import UsageError
from gpuslate.front.admin import AdminError
from gpuslate.front.caddy import MIN_VERSION, parse_version
from gpuslate.front.config import (
    front_config,
    hold_config,
    refuse_config,
    route_config,
    routed_upstream,
)
from gpuslate.front.counters import FrontCounters, parse_metrics, through


def test_a_route_reads_back_as_what_it_does() -> None:
    r = route_config(admin="/s/a", route="/s/r", upstream="127.0.0.1:30000")
    assert routed_upstream(json.loads(json.dumps(r))) == ("route", "127.0.0.1:30000")
    assert routed_upstream(hold_config(admin="/s/a")) == ("hold", None)
    assert routed_upstream(refuse_config(admin="/s/a", route="/s/r", reason="b did not start")) == \
        ("refuse", "b did not start")
    assert routed_upstream({"apps": {"http": {"servers": {"x": {}}}}}) == ("unknown", None)
    assert routed_upstream("nonsense") == ("unknown", None)


def test_the_front_holds_on_one_fixed_socket_and_its_admin_is_a_unix_socket() -> None:
    c = front_config(host="127.0.0.1", port=8000, admin="/s/a", route="/s/r", hold_s=900)
    assert c["admin"] == {"listen": "unix//s/a", "config": {"persist": False}}
    server = c["apps"]["http"]["servers"]["front"]
    assert server["listen"] == ["127.0.0.1:8000"]
    proxy = server["routes"][0]["handle"][0]
    assert proxy["upstreams"] == [{"dial": "unix//s/r"}]  # the only upstream: no placeholder
    assert proxy["transport"]["keep_alive"] == {"enabled": False}
    assert proxy["load_balancing"]["try_duration"] == "900s"
    assert "POST" in proxy["load_balancing"]["retry_match"][0]["method"]
    assert format_front("::1", 8000) == "[::1]:8000"


def test_counters_from_caddy_documents() -> None:
    text = "\n".join([
        '# HELP caddy_http_requests_in_flight x',
        'caddy_http_requests_in_flight{handler="reverse_proxy",server="front"} 9',
        'caddy_http_requests_in_flight{handler="reverse_proxy",server="other"} 100',
        'caddy_http_requests_total{handler="reverse_proxy",server="front"} 41',
        'caddy_http_request_errors_total{handler="reverse_proxy",server="front"} 2',
        'caddy_http_requests_total{handler="reverse_proxy",server="front"} NaN',
    ])
    assert parse_metrics(text) == (9, 41, 2)
    ups = [{"address": "unix//s/r", "num_requests": 3, "fails": 0}, {"address": "x", "num_requests": 7}]
    assert through(ups, "/s/r") == 3
    c = FrontCounters(9, 41, 2, 3)
    assert (c.arrived, c.held) == (50, 6)
    with pytest.raises(AdminError):
        through({"not": "a list"}, "/s/r")


@given(st.integers(0, 10**6), st.integers(0, 10**6))
def test_held_is_never_negative(in_flight: int, through_now: int) -> None:
    assert FrontCounters(in_flight, 0, 0, through_now).held == max(0, in_flight - through_now)


def test_versions_and_addresses() -> None:
    assert parse_version("v2.11.7 h1:abc") == (2, 11, 7)
    assert parse_version("2.6.2") == (2, 6, 2) < MIN_VERSION  # Debian bookworm's: refused
    assert parse_version("garbage") is None
    assert parse_front(8000) == ("127.0.0.1", 8000)  # loopback unless told otherwise
    assert parse_front("0.0.0.0:8000") == ("0.0.0.0", 8000)
    assert parse_front("[::1]:9") == ("::1", 9)
    for bad in ("", "x:", "host:70000", True, "999.1.1.1:80"):
        with pytest.raises(UsageError):
            parse_front(bad)
