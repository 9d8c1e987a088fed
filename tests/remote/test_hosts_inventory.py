"""Host specs and inventories: pure parsing, property-tested with hypothesis."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuslate.errors import UsageError
from gpuslate.remote.hosts import (
    MAX_HOSTS,
    HostSpec,
    count_hostlist,
    expand_host_words,
    expand_hostlist,
    format_inventory,
    parse_host,
    parse_inventory,
    select_hosts,
)

names = st.from_regex(r"[a-z][a-z0-9-]{0,10}(\.[a-z][a-z0-9-]{0,6}){0,2}", fullmatch=True)
ipv6 = st.sampled_from(["::1", "fe80::1", "2001:db8::7", "fd00:1:2::3"])
users = st.none() | st.from_regex(r"[a-z_][a-z0-9_-]{0,8}", fullmatch=True)
ports = st.none() | st.integers(1, 65535)
plain = st.builds(lambda a, u, p: HostSpec(a, u, p), names | ipv6, users, ports)
aliased = st.builds(lambda a, u, p, n: HostSpec(a, u, p, n), names | ipv6, users, ports,
                    st.from_regex(r"gpu[a-z0-9]{1,6}", fullmatch=True))
groups = st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True).filter(lambda g: g not in ("all", "ungrouped"))


@given(plain)
def test_host_spec_round_trip(h):
    assert parse_host(h.spec) == h


@pytest.mark.parametrize("text,expected", [
    ("gpu1", HostSpec("gpu1")),
    ("root@gpu1", HostSpec("gpu1", "root")),
    ("root@gpu1:2222", HostSpec("gpu1", "root", 2222)),
    ("10.0.0.7:22", HostSpec("10.0.0.7", None, 22)),
    ("[::1]:2222", HostSpec("::1", None, 2222)),
    ("admin@[fe80::1%eth0]:22", HostSpec("fe80::1%eth0", "admin", 22)),
    ("::1", HostSpec("::1")),
])
def test_parse_host(text, expected):
    assert parse_host(text) == expected


@pytest.mark.parametrize("bad", ["", "-oProxyCommand=x", "gpu1:0", "gpu1:99999", "gpu1:x", "a b", "h;ls",
                                 "u@", "@h", "[::1", "[::1]x", "$(id)", "h\nx", "us er@h"])
def test_parse_host_refuses(bad):
    with pytest.raises(UsageError):
        parse_host(bad)


@settings(max_examples=60)
@given(st.dictionaries(groups, st.lists(plain | aliased, min_size=1, max_size=5, unique=True), max_size=4),
       st.lists(plain, max_size=3, unique=True))
def test_inventory_round_trip(grouped, ungrouped):
    text = format_inventory({"ungrouped": ungrouped, **grouped})
    inv = parse_inventory(text).groups
    for name, hosts in grouped.items():
        assert inv[name] == hosts
    assert inv.get("ungrouped", []) == ungrouped
    assert inv["all"] == list(dict.fromkeys(ungrouped + [h for hs in grouped.values() for h in hs]))


ANSIBLE = """
# an Ansible INI inventory, as a fleet already has it
bastion.example.com

[h200]
gpu-a ansible_host=10.0.0.11 ansible_user=root
gpu-b ansible_host=10.0.0.12 ansible_port=2222 ansible_user=ops  ; a trailing comment is not Ansible's, '#' is
gpu[03:04].example.com

[h100]
old-1 ansible_host=10.1.0.1

[gpus:children]
h200
h100

[gpus:vars]
ansible_python_interpreter=/usr/bin/python3
"""


def test_ansible_inventory():
    inv = parse_inventory(ANSIBLE.replace("  ; a trailing comment is not Ansible's, '#' is", "  # trailing"))
    h200 = inv.select("h200")
    assert h200[0] == HostSpec("10.0.0.11", "root", None, "gpu-a") and h200[0].label == "gpu-a"
    assert h200[1] == HostSpec("10.0.0.12", "ops", 2222, "gpu-b")
    assert [h.address for h in h200[2:]] == ["gpu03.example.com", "gpu04.example.com"]
    assert [h.label for h in inv.select("gpus")] == ["gpu-a", "gpu-b", "gpu03.example.com",
                                                      "gpu04.example.com", "old-1"]
    assert inv.select(None)[0] == HostSpec("bastion.example.com")
    assert inv.select("ungrouped") == [HostSpec("bastion.example.com")]
    with pytest.raises(UsageError, match="no group 'h300'"):
        inv.select("h300")


@pytest.mark.parametrize("bad,msg", [
    ("[g\nh1\n", "line 1"),
    ("[g:children]\nnope\n", "unknown child group"),
    ("[a:children]\nb\n[b:children]\na\n", "contains itself"),
    ("[g]\nh1 ansible_port=x\n", "line 2"),
    ("[g]\nh1 nokeyvalue\n", "line 2"),
    ("[g]\n-oProxyCommand=x\n", "line 2"),
    ("[g]\nh[5:1]\n", "invalid range"),
])
def test_inventory_refuses(bad, msg):
    with pytest.raises(UsageError, match=msg):
        parse_inventory(bad)


def test_select_hosts_merges_without_duplicates():
    assert select_hosts(["h1", "root@h2"], "h1\nh3\n", None) == [HostSpec("h1"), HostSpec("h2", "root"),
                                                                 HostSpec("h3")]
    with pytest.raises(UsageError, match="--group needs"):
        select_hosts(["h1"], None, "g")
    with pytest.raises(UsageError, match="no hosts"):
        select_hosts([], "# empty\n", None)


# --- Slurm hostlists and the bound on expansion (issue 18; issue 15 class H) ---------------------

@pytest.mark.parametrize("text,expected", [
    ("node[01-03]", ["node01", "node02", "node03"]),
    ("n[1-3,7],gpu[01-02]-ib", ["n1", "n2", "n3", "n7", "gpu01-ib", "gpu02-ib"]),
    ("r[1-2]n[08-10]", ["r1n08", "r1n09", "r1n10", "r2n08", "r2n09", "r2n10"]),
    ("gpu[1:2]", ["gpu1", "gpu2"]),
    ("plain", ["plain"]),
    ("a,b, c", ["a", "b", "c"]),
])
def test_expand_hostlist(text, expected):
    assert expand_hostlist(text) == expected
    assert count_hostlist(text) == len(expected)


@given(st.lists(st.tuples(st.integers(0, 300), st.integers(0, 40), st.booleans()), min_size=1, max_size=3))
def test_hostlist_counts_match_and_keep_width(ranges):
    text = "h" + "x".join(f"[{lo:03d}-{lo + span:03d}]" if pad else f"[{lo}-{lo + span}]"
                          for lo, span, pad in ranges)
    n = count_hostlist(text)
    if n > MAX_HOSTS:
        with pytest.raises(UsageError, match="at most"):
            expand_hostlist(text)
        return
    names = expand_hostlist(text)
    assert len(names) == n == len(set(names))
    assert all(n.startswith("h") for n in names)


def test_huge_ranges_are_refused_before_expanding():
    """issue 15 H: gpu[0:4096]x[0:4096] is 16.8 M hosts: one UsageError at once, no MemoryError."""
    import time

    for text in ("gpu[0:4096]x[0:4096]", "n[0-99999999999999]", "a[1-3000],b[1-3000],c[1-3000],d[1-3000]"):
        t0 = time.monotonic()
        with pytest.raises(UsageError, match="at most 10000"):
            expand_hostlist(text)
        assert time.monotonic() - t0 < 0.5
    with pytest.raises(UsageError, match=r"line 2: .*at most"):
        parse_inventory("[g]\ngpu[0:4096]x[0:4096]\n")
    with pytest.raises(UsageError, match=r"line 3: .*at most"):  # the bound is on the whole inventory
        parse_inventory("a[0:6000]\n\nb[0:6000]\n")


@pytest.mark.parametrize("bad", ["n[a-b]", "n[3-1]", "n[1-]", "n[,]"])
def test_hostlist_refuses(bad):
    with pytest.raises(UsageError, match="invalid range"):
        expand_hostlist(bad)


def test_host_option_takes_hostlists():
    assert expand_host_words("root@gpu[01-02]:2222") == ["root@gpu01:2222", "root@gpu02:2222"]
    assert expand_host_words("[::1]:22") == ["[::1]:22"]  # an IPv6 address, not a range
    assert select_hosts(["n[1-2],m"], "gpu[01-02]\n", None) == [
        HostSpec("n1"), HostSpec("n2"), HostSpec("m"), HostSpec("gpu01"), HostSpec("gpu02")]


def test_cli_refuses_a_huge_inventory_in_one_line(tmp_path):
    """The whole CLI: one line on stderr, exit 2, no traceback, nothing contacted."""
    from helpers import run_cli

    inv = tmp_path / "inventory.ini"
    inv.write_text("[gpus]\ngpu[0:4096]x[0:4096]\n")
    r = run_cli("--hosts", str(inv), "status")
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and "at most 10000" in r.stderr and "Traceback" not in r.stderr
    r = run_cli("-H", "n[0-99999]", "status")
    assert r.returncode == 2 and "at most 10000" in r.stderr and "Traceback" not in r.stderr
