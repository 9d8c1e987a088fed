"""The listen-address rule: loopback unless --allow-remote; IP addresses and ports only."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuslate.errors import UsageError
from gpuslate.exporter.server import format_address, parse_listen


@pytest.mark.parametrize("text, expected", [
    ("127.0.0.1:9847", ("127.0.0.1", 9847)), ("localhost:0", ("127.0.0.1", 0)), ("[::1]:9847", ("::1", 9847)),
    ("127.8.9.10:65535", ("127.8.9.10", 65535)),
])
def test_loopback_addresses(text, expected):
    assert parse_listen(text) == expected
    assert parse_listen(format_address(expected)) == expected


@given(st.ip_addresses(), st.integers(0, 65535), st.booleans())
def test_non_loopback_only_with_allow_remote(addr, port, allow):
    text = format_address((str(addr), port))
    if addr.is_loopback or allow:
        assert parse_listen(text, allow_remote=allow) == (str(addr), port)
    else:
        with pytest.raises(UsageError, match="not a loopback address"):
            parse_listen(text, allow_remote=allow)


@given(st.text(max_size=40))
def test_anything_else_is_a_usage_error_or_a_valid_address(text):
    try:
        host, port = parse_listen(text, allow_remote=True)
    except UsageError as exc:
        assert "\n" not in str(exc)
        return
    ipaddress.ip_address(host)
    assert 0 <= port <= 65535
