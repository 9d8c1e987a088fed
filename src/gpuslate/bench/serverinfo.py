"""What ``gpuslate bench`` learns from the server besides its answers: the model, the
engine and version, and the speculative-decoding counters read between levels."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

from .._document import parse_json
from ..engines import BACKENDS, Answers, by_reported
from ..engines.base import fact_value
from ..errors import ServerFailed
from .client import connect_failure, read_body

PROBE_TIMEOUT_S = 10.0  # model list and server-info look-ups
# Engines that take vLLM's stream_options.continuous_usage_stats (usage on every chunk), as recorded
CONTINUOUS_USAGE_ENGINES = tuple(e.reported for e in BACKENDS.values() if e.continuous_usage)


async def get_json(session: aiohttp.ClientSession, url: str,
                   headers: Mapping[str, str] | None = None) -> tuple[int, Any]:
    async with session.get(url, timeout=aiohttp.ClientTimeout(total=PROBE_TIMEOUT_S),
                           headers=dict(headers or {})) as resp:
        try:  # bounded: size, depth and numbers (a BadDocument is a ValueError)
            body = await read_body(resp)
            return resp.status, parse_json(body) if body else None
        except ValueError:
            return resp.status, None


async def resolve_model(session: aiohttp.ClientSession, base: str, model: str | None,
                        headers: Mapping[str, str]) -> str:
    """Check that the server answers (one clear error if not) and pick the model."""
    try:
        status, doc = await get_json(session, base + "/v1/models", headers)
    except (aiohttp.ClientConnectorError, asyncio.TimeoutError, aiohttp.ServerDisconnectedError) as exc:
        why = connect_failure(exc) if isinstance(exc, aiohttp.ClientConnectorError) else (
            f"no answer within {PROBE_TIMEOUT_S:g} s" if isinstance(exc, asyncio.TimeoutError)
            else "disconnected")
        raise ServerFailed(f"cannot reach the server at {base}: {why}",
                           hint="is it running? (a test server: gpuslate sim serve --port 0)") from None
    except aiohttp.ClientError as exc:
        raise ServerFailed(f"cannot reach the server at {base}: {exc}") from None
    if status == 503:
        raise ServerFailed(f"the server at {base} is not ready yet (503)",
                           hint="wait for it, e.g. with gpuslate up's readiness check")
    if status in (401, 403):
        raise ServerFailed(f"the server at {base} refused the request ({status}): it wants an API key",
                           hint="give it with --api-key KEY or OPENAI_API_KEY")
    if model is not None:
        return model
    data = doc.get("data") if isinstance(doc, dict) else None
    if status != 200 or not isinstance(data, list) or not data or not isinstance(data[0], dict) \
            or not isinstance(data[0].get("id"), str):
        raise ServerFailed(f"the server at {base} lists no model on GET /v1/models (HTTP {status})",
                           hint="name one with --model")
    return data[0]["id"]


async def server_facts(session: aiohttp.ClientSession, base: str,
                       headers: Mapping[str, str]) -> dict[str, Any]:
    """Engine and version where the server reports them, with the settings its engine module
    records (``gpuslate.engines``: each engine's ``probes`` and ``identify``): the simulator first
    (it may play another engine), then the engines whose ``owned_by`` the server's ``GET /v1/models``
    names. The simulator playing an engine (``sim serve --emulate``) is recorded as that engine,
    flagged ``simulated``."""
    answers: dict[str, Any] = {}

    async def get(path: str) -> Any:
        if path not in answers:
            status, doc = await get_json(session, base + path, headers)
            answers[path] = doc if status == 200 else None
        return answers[path]

    try:
        models = await get("/v1/models")
        data = models.get("data") if isinstance(models, dict) else None
        first = data[0] if isinstance(data, list) and data and isinstance(data[0], dict) else {}
        owned = first.get("owned_by") if isinstance(first.get("owned_by"), str) else None
        # a simulated server says so, whomever it plays; then the engines its owned_by names
        for e in sorted(BACKENDS.values(), key=lambda e: (not e.plays_others, e.owned_by != owned)):
            for path in e.probes:
                await get(path)
            facts = e.identify(Answers(answers, owned))
            if facts is None:
                continue
            played = BACKENDS.get(facts["engine"]) if facts.get("simulated") else None
            doc = answers.get(facts.get("info_path", ""))
            if played is not None and isinstance(doc, dict):  # the emulated engine's own settings, as it reports them
                facts.update({k: doc[k] for k in played.facts if k in doc and fact_value(doc[k])})
            return facts
    except (aiohttp.ClientError, asyncio.TimeoutError):
        return {}
    return {}


@dataclass(frozen=True)
class SpecCounters:
    tokens: float  # tokens produced by verified speculative steps (or accepted drafts + 1 per draft)
    steps: float  # request-steps (verifications) they came from
    cumulative: float | None  # the server's own running mean, when that is all there is
    all_tokens: float | None = None  # tokens of every request-step, speculative or not
    all_steps: float | None = None  # every request-step


@dataclass(frozen=True)
class Acceptance:
    """One level's acceptance: tokens per request-step over all steps, over speculative
    steps only, and the share of request-steps that were speculative (None: unknown)."""

    all_steps: float | None
    spec_steps: float | None
    spec_share: float | None


async def spec_counters(session: aiohttp.ClientSession, base: str, server: dict[str, Any],
                        headers: Mapping[str, str]) -> SpecCounters | None:
    """The server's speculative-decoding counters, read between levels."""
    e = by_reported(server.get("engine"))
    if e is None:
        return None
    info_path = server.get("info_path") if server.get("simulated") else e.counters.info_path
    try:
        if isinstance(info_path, str) and info_path.startswith("/"):
            status, doc = await get_json(session, base + server.get("info_path", info_path), headers)
            if status != 200 or not isinstance(doc, dict):
                return None
            counters = doc.get("counters") or {}
            if "spec_tokens" in counters and "spec_request_steps" in counters:
                return SpecCounters(counters["spec_tokens"], counters["spec_request_steps"], None,
                                    counters.get("total_generated_tokens"), counters.get("request_steps"))
            states = doc.get("internal_states") or [{}]
            mean = states[0].get("avg_spec_accept_length") if isinstance(states[0], dict) else None
            return SpecCounters(0, 0, float(mean)) if isinstance(mean, (int, float)) and mean else None
        if e.counters.prometheus is not None:
            async with session.get(base + "/metrics", headers=dict(headers),
                                   timeout=aiohttp.ClientTimeout(total=PROBE_TIMEOUT_S)) as resp:
                if resp.status != 200:
                    return None
                text = await resp.text()
            accepted = prom_sum(text, e.counters.prometheus[0])
            drafts = prom_sum(text, e.counters.prometheus[1])
            if accepted is None or drafts is None:
                return None
            # the mean acceptance length counts the bonus token: 1 + accepted / drafts (vLLM's).
            return SpecCounters(accepted + drafts, drafts, None)
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
        return None
    return None


def prom_sum(text: str, name: str) -> float | None:
    """Sum of a Prometheus counter over its label sets; None if absent."""
    total = None
    for line in text.splitlines():
        if line.startswith(name) and (len(line) == len(name) or line[len(name)] in " {"):
            try:
                total = (total or 0.0) + float(line.rsplit(" ", 1)[1])
            except (IndexError, ValueError):
                continue
    return total


def accept_length_between(before: SpecCounters | None, after: SpecCounters | None) -> float | None:
    """Mean accepted tokens per speculative verification during one level; None if the server
    has no such counters or ran no speculative step in it."""
    return acceptance_between(before, after).spec_steps


def acceptance_between(before: SpecCounters | None, after: SpecCounters | None) -> Acceptance:
    """The level's :class:`Acceptance` from the counters read before and after it."""
    if after is None:
        return Acceptance(None, None, None)
    if after.cumulative is not None:
        return Acceptance(None, after.cumulative, None)

    def delta(a: float | None, b: float | None) -> float | None:
        return None if a is None or (before is not None and b is None) else a - (b or 0)

    steps = after.steps - (before.steps if before else 0)
    tokens = after.tokens - (before.tokens if before else 0)
    spec = tokens / steps if steps > 0 else None
    all_steps = delta(after.all_steps, before.all_steps if before else None)
    all_tokens = delta(after.all_tokens, before.all_tokens if before else None)
    if all_steps is None or all_tokens is None or all_steps <= 0:
        return Acceptance(None, spec, None)
    return Acceptance(all_tokens / all_steps, spec, steps / all_steps)
