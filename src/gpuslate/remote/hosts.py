"""Which hosts: ``[USER@]HOST[:PORT]`` specs and inventory files.

An inventory is one host a line, ``#`` comments and ``[group]`` sections; the
same parser reads an Ansible INI inventory (``NAME ansible_host=ADDR
ansible_port=N ansible_user=U``, ``[group:children]``, ``[group:vars]``, and
numeric ranges such as ``gpu[01:04]``), so a fleet can reuse the inventory it
has. Slurm hostlist expressions (``node[01-32]``, ``n[1-3,7],gpu[01-02]-ib``)
are read wherever hosts are named: ``-H``, inventory lines and, for
``--slurm``, ``SLURM_JOB_NODELIST``. Expansion is bounded before anything is
generated (:data:`MAX_HOSTS` in all), so ``gpu[0:4096]x[0:4096]`` is one line
of refusal, not 16.8 million names in memory. Everything here is pure: text
in, values out, :class:`UsageError` with the line number for anything
malformed.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator, Sequence
from typing import NamedTuple

from ..errors import UsageError

# A host name or IPv4 address (never starting with '-': ssh would read an option),
# an IPv6 address (with an optional %zone), a user name.
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
_IPV6 = re.compile(r"[0-9A-Fa-f:.]*:[0-9A-Fa-f:.]*(%[A-Za-z0-9_.-]+)?")
_USER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*\$?")
_GROUP = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
_SECTION = re.compile(r"\[\s*([A-Za-z0-9_][A-Za-z0-9_.-]*)(?::([A-Za-z]+))?\s*\]")
# a bracketed range group right after a name character: [01-04], [1-3,7], Ansible's [01:04]
_GROUP_RX = re.compile(r"(?<=[A-Za-z0-9_.-])\[([^\[\]]*)\]")
_RANGE_ITEM = re.compile(r"(\d{1,18})(?:([-:])(\d{1,18}))?")
#: the most hosts one command may name (a -H list, an inventory, an allocation's node list)
MAX_HOSTS = 10000
ALL = "all"
UNGROUPED = "ungrouped"


class HostSpec(NamedTuple):
    """One host to reach: ``address`` is what ssh connects to (a name, an ssh_config
    alias or an address); ``name`` is the label shown, the inventory name when it
    differs from the address (Ansible's ``ansible_host``)."""

    address: str
    user: str | None = None
    port: int | None = None
    name: str | None = None

    @property
    def label(self) -> str:
        return self.name or self.spec

    @property
    def spec(self) -> str:
        """``[USER@]HOST[:PORT]``, the form :func:`parse_host` reads back."""
        addr = f"[{self.address}]" if ":" in self.address and self.port is not None else self.address
        return (f"{self.user}@" if self.user else "") + addr + (f":{self.port}" if self.port is not None else "")

    @property
    def ssh_words(self) -> str:
        """How to reach it with plain ssh, for hints: ``[-p PORT] [USER@]HOST``."""
        return (f"-p {self.port} " if self.port is not None else "") + \
            (f"{self.user}@" if self.user else "") + self.address


def _port(text: str, what: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise UsageError(f"invalid port {text!r} in {what!r}: 1 to 65535")
    return int(text)


def _address(text: str, what: str) -> str:
    if not (_NAME.fullmatch(text) or _IPV6.fullmatch(text)):
        raise UsageError(f"invalid host {text!r} in {what!r}: a host name, alias, or IPv4/IPv6 address")
    return text


def parse_host(text: str) -> HostSpec:
    """``[USER@]HOST[:PORT]``; IPv6 as ``[ADDR]:PORT`` or bare (``::1``, no port)."""
    rest = text.strip()
    user = None
    if "@" in rest:
        user, rest = rest.rsplit("@", 1)
        if not _USER.fullmatch(user):
            raise UsageError(f"invalid user {user!r} in host {text!r}")
    port = None
    if rest.startswith("["):
        addr, sep, tail = rest[1:].partition("]")
        if not sep or (tail and not tail.startswith(":")):
            raise UsageError(f"invalid host {text!r}: expected [ADDRESS] or [ADDRESS]:PORT")
        if tail:
            port = _port(tail[1:], text)
    elif rest.count(":") == 1:
        addr, p = rest.split(":")
        port = _port(p, text)
    else:
        addr = rest  # a name, or a bare IPv6 address (no port possible)
    return HostSpec(_address(addr, text), user, port)


class Inventory(NamedTuple):
    """Groups of hosts, in file order. Every host is in ``all``; hosts before any
    section (or in no group) are in ``ungrouped``."""

    groups: dict[str, list[HostSpec]]

    def select(self, group: str | None) -> list[HostSpec]:
        name = group or ALL
        if name not in self.groups:
            known = ", ".join(sorted(self.groups)) or "none"
            raise UsageError(f"no group {name!r} in the inventory (groups: {known})")
        return list(self.groups[name])


def _group_values(body: str, whole: str) -> list[tuple[int, int, int]]:
    """(low, high, zero-padded width) of each item of one bracket group."""
    out = []
    for item in body.split(","):
        m = _RANGE_ITEM.fullmatch(item.strip())
        if m is None:
            raise UsageError(f"invalid range [{body}] in {whole!r}: expected numbers such as [01-04] or [1,3-5]")
        lo = m.group(1)
        hi = m.group(3) if m.group(3) is not None else lo
        if int(hi) < int(lo):
            raise UsageError(f"invalid range [{body}] in {whole!r}: {lo} is above {hi}")
        out.append((int(lo), int(hi), len(lo) if lo.startswith("0") and len(lo) > 1 else 0))
    return out


def count_hostlist(text: str) -> int:
    """How many names :func:`expand_hostlist` would give, without generating them."""
    total = 0
    for item in _split_top(text):
        n = 1
        for m in _GROUP_RX.finditer(item):
            n *= sum(hi - lo + 1 for lo, hi, _ in _group_values(m.group(1), text))
        total += n
    return total


def _split_top(text: str) -> list[str]:
    """Split at the commas outside brackets: ``n[1,2],m`` -> ``n[1,2]``, ``m``."""
    items: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in text:
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            items.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    items.append("".join(cur))
    return [i.strip() for i in items if i.strip()]


def expand_hostlist(text: str, *, limit: int = MAX_HOSTS) -> list[str]:
    """A Slurm hostlist expression (or Ansible range) as names, in order:
    ``n[01-03,7],gpu[1:2]`` -> n01, n02, n03, n07, gpu1, gpu2 (zero padding kept).
    Counted first: more than ``limit`` names is a :class:`UsageError` before any is made."""
    n = count_hostlist(text)
    if n > limit:
        raise UsageError(f"host list {_shown(text)} names {n} hosts: at most {limit} may be named")
    return [name for item in _split_top(text) for name in _expand_item(item, text)]


def _expand_item(item: str, whole: str) -> Iterator[str]:
    groups = list(_GROUP_RX.finditer(item))
    if not groups:
        yield item
        return
    literals, choices, pos = [], [], 0
    for m in groups:
        literals.append(item[pos:m.start()])
        choices.append([str(i).zfill(w) for lo, hi, w in _group_values(m.group(1), whole)
                        for i in range(lo, hi + 1)])
        pos = m.end()
    tail = item[pos:]
    for combo in itertools.product(*choices):
        yield "".join(lit + c for lit, c in zip(literals, combo)) + tail


def _shown(text: str, limit: int = 60) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


def _expand(name: str, lineno: int, budget: list[int] | None = None) -> list[str]:
    """One inventory name with its ranges (Ansible ``gpu[01:03]`` or Slurm ``gpu[01-03]``);
    ``budget`` (a one-item list) is what the whole inventory may still name."""
    left = budget[0] if budget is not None else MAX_HOSTS
    try:
        names = expand_hostlist(name, limit=left) if "[" in name else [name]
    except UsageError as exc:
        raise UsageError(f"line {lineno}: {exc}") from None
    if budget is not None:
        budget[0] -= len(names)
    return names


def _host_line(words: list[str], lineno: int, budget: list[int] | None = None) -> list[HostSpec]:
    first, pairs = words[0], words[1:]
    variables: dict[str, str] = {}
    for w in pairs:
        key, sep, value = w.partition("=")
        if not sep:
            raise UsageError(f"line {lineno}: expected KEY=VALUE after the host, got {w!r}")
        variables[key] = value.strip("'\"")
    if not variables:
        # a plain [USER@]HOST[:PORT] line (ranges allowed in the name)
        return [parse_host(h) for h in _expand(first, lineno, budget)]
    out = []
    for name in _expand(first, lineno, budget):
        addr = variables.get("ansible_host") or variables.get("ansible_ssh_host") or name
        port = variables.get("ansible_port") or variables.get("ansible_ssh_port")
        user = variables.get("ansible_user") or variables.get("ansible_ssh_user")
        try:
            spec = HostSpec(_address(addr, name), user, _port(port, name) if port else None,
                            name if addr != name else None)
            if user is not None and not _USER.fullmatch(user):
                raise UsageError(f"invalid user {user!r} for {name!r}")
        except UsageError as exc:
            raise UsageError(f"line {lineno}: {exc}") from None
        out.append(spec)
    return out


def parse_inventory(text: str) -> Inventory:
    direct: dict[str, list[HostSpec]] = {UNGROUPED: []}
    children: dict[str, list[str]] = {}
    section, kind = UNGROUPED, "hosts"
    budget = [MAX_HOSTS]  # names the whole inventory may still expand to
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = "" if raw.lstrip().startswith(";") else raw.split("#", 1)[0].strip()
        if not line:
            continue
        header = _SECTION.fullmatch(line)
        if header is None and line.startswith("[") and not line.startswith("[:") and "]" not in line:
            raise UsageError(f"line {lineno}: unterminated section {line!r}")
        if header is not None:  # (a line like [::1]:22 is an IPv6 host, not a section)
            section, kind = header.group(1), header.group(2) or "hosts"
            if kind not in ("hosts", "children", "vars"):
                raise UsageError(f"line {lineno}: invalid section {line!r}")
            if kind == "children":
                children.setdefault(section, [])
            elif kind == "hosts":
                direct.setdefault(section, [])
            continue
        if kind == "vars":
            continue  # group variables: nothing gpuslate uses
        words = line.split()
        if kind == "children":
            if len(words) != 1 or not _GROUP.fullmatch(words[0]):
                raise UsageError(f"line {lineno}: expected a group name, got {line!r}")
            children[section].append(words[0])
            continue
        try:
            direct[section] += _host_line(words, lineno, budget)
        except UsageError as exc:
            msg = str(exc)
            raise UsageError(msg if msg.startswith("line ") else f"line {lineno}: {msg}") from None

    groups: dict[str, list[HostSpec]] = {}

    def members(name: str, seen: tuple[str, ...]) -> list[HostSpec]:
        if name in seen:
            raise UsageError(f"group {name!r} contains itself (through {' -> '.join(seen)})")
        if name in groups:
            return groups[name]
        if name not in direct and name not in children:
            raise UsageError(f"group {seen[-1]!r} names unknown child group {name!r}")
        out = list(direct.get(name, []))
        for child in children.get(name, []):
            out += members(child, seen + (name,))
        groups[name] = list(dict.fromkeys(out))
        return groups[name]

    for name in list(direct) + list(children):
        members(name, ())
    everyone = [h for hs in groups.values() for h in hs]
    groups[ALL] = list(dict.fromkeys(everyone + groups.get(ALL, [])))
    if not groups[UNGROUPED]:
        del groups[UNGROUPED]
    return Inventory(groups)


def format_inventory(groups: dict[str, Sequence[HostSpec]]) -> str:
    """Text that :func:`parse_inventory` reads back into the same groups."""
    lines: list[str] = []
    for name, hosts in groups.items():
        if name != UNGROUPED:
            lines.append(f"[{name}]")
        for h in hosts:
            if h.name is not None:
                words = [h.name, f"ansible_host={h.address}"]
                words += [f"ansible_port={h.port}"] if h.port is not None else []
                words += [f"ansible_user={h.user}"] if h.user else []
                lines.append(" ".join(words))
            else:
                lines.append(h.spec)
    return "\n".join(lines) + "\n"


def expand_host_words(text: str) -> list[str]:
    """One ``-H`` value: ``[USER@]HOST[:PORT]``, where HOST may be a hostlist
    (``root@gpu[01-04]:22``, ``n1,n2``); a bracketed IPv6 address stays one host."""
    rest = text.strip()
    if "," not in rest and not _GROUP_RX.search(rest):
        return [text]
    user, at, rest = rest.rpartition("@")
    port = ""
    m = re.search(r":(\d+)$", rest)
    if m is not None and ":" not in re.sub(r"\[[^\]]*\]", "", rest[:m.start()]):
        rest, port = rest[:m.start()], m.group(0)
    return [f"{user}{at}{name}{port}" for name in expand_hostlist(rest)]


def select_hosts(hosts: Sequence[str], inventory_text: str | None, group: str | None) -> list[HostSpec]:
    """The hosts of ``--host`` (in order) then of ``--hosts FILE`` / ``--group``, without duplicates."""
    if group is not None and inventory_text is None:
        raise UsageError("--group needs an inventory: give --hosts FILE")
    out = [parse_host(name) for h in hosts for name in expand_host_words(h)]
    if inventory_text is not None:
        out += parse_inventory(inventory_text).select(group)
    if not out:
        raise UsageError("no hosts selected: the inventory or group is empty")
    return list(dict.fromkeys(out))
