"""parse_json, the bounded parser of every document from outside (issue 25), against its rule with
hypothesis: what gpuslate writes (``json.dumps`` of values within the bounds) reads back equal; text
nested deeper than the limit, numbers out of range, invalid UTF-8 and any other input are a
BadDocument, never a RecursionError or another exception; and what a peer sends decides the host's
failure (``null`` is a bad document, not exit 1)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuslate._document import MAX_DEPTH, parse_json
from gpuslate.errors import BadDocument
from gpuslate.remote.fleet import interpret
from gpuslate.remote.hosts import HostSpec
from gpuslate.remote.ssh import SshOptions, SshResult

numbers = st.one_of(st.integers(-(10**18), 10**18), st.floats(allow_nan=False, allow_infinity=False,
                                                              min_value=-1e50, max_value=1e50))
scalars = st.one_of(st.none(), st.booleans(), numbers, st.text(max_size=20))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                      max_leaves=30)


def depth(v: object) -> int:
    if isinstance(v, list):
        return 1 + max((depth(x) for x in v), default=0)
    if isinstance(v, dict):
        return 1 + max((depth(x) for x in v.values()), default=0)
    return 0


@given(values)
def test_what_gpuslate_writes_reads_back_equal(v):
    for text in (json.dumps(v), json.dumps(v, indent=2), json.dumps(v, ensure_ascii=False)):
        assert parse_json(text) == v
        assert parse_json(text.encode()) == v


@given(st.integers(1, 3 * MAX_DEPTH), st.sampled_from(["[", "{\"a\":"]))
def test_nesting_is_refused_exactly_beyond_the_limit(n, opener):
    closer = "]" if opener == "[" else "}"
    text = opener * n + "1" + closer * n
    if n <= MAX_DEPTH:
        assert depth(parse_json(text)) == n
    else:
        with pytest.raises(BadDocument, match=f"deeper than {MAX_DEPTH}"):
            parse_json(text)


@settings(max_examples=300)
@given(st.one_of(st.binary(max_size=200), st.text(alphabet='[]{}"\\,:0123456789eE+-.aNI \n\udcff', max_size=200)))
def test_any_input_is_a_value_or_one_bad_document(data):
    try:
        parse_json(data)
    except BadDocument as exc:
        assert str(exc).isprintable() and len(str(exc)) < 200


@pytest.mark.parametrize("text", ["[" * 200_000, "[" * 200_000 + "]" * 200_000, '{"a": 1e999}', "[NaN]",
                                  "[1" + "0" * 5000 + "]", '["\udcff"]'])
def test_the_shapes_of_the_issue_are_bad_documents(text):
    with pytest.raises(BadDocument):
        parse_json(text)


def test_a_document_larger_than_the_limit_is_refused_before_parsing():
    with pytest.raises(BadDocument, match="more than 100 bytes"):
        parse_json(b" " * 101, max_bytes=100)


@pytest.mark.parametrize("stdout,rc,code", [("null", 0, "bad_document"), ("[1, 2]", 0, "bad_document"),
                                            ('"a"', 0, "bad_document"), ("[" * 100_000, 0, "bad_document"),
                                            ("junk", 1, "command_failed"), ("", 3, "command_failed")])
def test_what_a_host_sends_decides_its_failure(stdout, rc, code):
    err_text = "gpuslate: error: it failed\n" if code == "command_failed" else ""
    doc, err = interpret(HostSpec("h"), SshResult(rc, stdout, err_text, 0.1), SshOptions())
    assert doc is None and err is not None and err.code == code, err
    assert code != "bad_document" or "not" in err.message
