"""What ``gpuslate bench`` learns from the server besides its answers: the model, the
engine and version, and the speculative-decoding counters read between levels."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

from .. import __version__
from .._document import parse_json
from ..errors import ServerFailed
from .client import connect_failure, read_body

PROBE_TIMEOUT_S = 10.0  # model list and server-info look-ups
# Engines that take vLLM's stream_options.continuous_usage_stats (usage on every chunk).
CONTINUOUS_USAGE_ENGINES = ("gpuslate-sim", "vllm", "sglang")


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


#: SGLang's server args that decide whether its adaptive speculative mode applies (recorded per point)
SGLANG_FACTS = ("speculative_algorithm", "speculative_num_steps", "speculative_eagle_topk",
                "speculative_num_draft_tokens", "speculative_adaptive", "speculative_adaptive_config",
                "enable_dp_attention", "dp_size", "enable_multi_layer_eagle", "enable_two_batch_overlap",
                "enable_pdmux", "pp_size")
_SIM_FACTS = ("mode", "spec_disable_threshold", "time_scale")


def _fact(v: object) -> bool:
    """A fact worth keeping from a server's document: a scalar, a short string (bounded bytes)."""
    return v is None or isinstance(v, (bool, int, float)) or (isinstance(v, str) and len(v) <= 256)


async def server_facts(session: aiohttp.ClientSession, base: str,
                       headers: Mapping[str, str]) -> dict[str, Any]:
    """Engine and version where the server reports them: SGLang's ``/get_server_info`` (or
    ``/server_info``, its newer name) with the server args that decide its adaptive mode, vLLM's
    ``/version``, the simulator's own info (and the engine it emulates, flagged ``simulated``)."""
    for path in ("/get_server_info", "/server_info"):
        try:
            status, doc = await get_json(session, base + path, headers)
        except (aiohttp.ClientError, asyncio.TimeoutError):
            return {}
        if status == 200 and isinstance(doc, dict):
            emulated = doc.get("emulates") if doc.get("simulated") else None
            if doc.get("simulated") and emulated not in ("vllm", "sglang"):
                facts: dict[str, Any] = {"engine": "gpuslate-sim", "version": __version__, "info_path": path}
            else:
                facts = {"engine": emulated or "sglang",
                         "version": doc.get("engine_version" if emulated else "version"), "info_path": path}
                if emulated:
                    facts["simulated"] = True
            for key in (*_SIM_FACTS, *SGLANG_FACTS):
                if key in doc and _fact(doc[key]):
                    facts[key] = doc[key]
            if not _fact(facts["version"]):
                facts["version"] = None
            return facts
    try:
        status, doc = await get_json(session, base + "/version", headers)
    except (aiohttp.ClientError, asyncio.TimeoutError):
        return {}
    if status == 200 and isinstance(doc, dict) and isinstance(doc.get("version"), str) and _fact(doc["version"]):
        return {"engine": "vllm", "version": doc["version"]}
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
    try:
        if server.get("engine") in ("sglang", "gpuslate-sim") or server.get("simulated"):
            status, doc = await get_json(session, base + server.get("info_path", "/get_server_info"), headers)
            if status != 200 or not isinstance(doc, dict):
                return None
            counters = doc.get("counters") or {}
            if "spec_tokens" in counters and "spec_request_steps" in counters:
                return SpecCounters(counters["spec_tokens"], counters["spec_request_steps"], None,
                                    counters.get("total_generated_tokens"), counters.get("request_steps"))
            states = doc.get("internal_states") or [{}]
            mean = states[0].get("avg_spec_accept_length") if isinstance(states[0], dict) else None
            return SpecCounters(0, 0, float(mean)) if isinstance(mean, (int, float)) and mean else None
        if server.get("engine") == "vllm":
            async with session.get(base + "/metrics", headers=dict(headers),
                                   timeout=aiohttp.ClientTimeout(total=PROBE_TIMEOUT_S)) as resp:
                if resp.status != 200:
                    return None
                text = await resp.text()
            accepted = prom_sum(text, "vllm:spec_decode_num_accepted_tokens_total")
            drafts = prom_sum(text, "vllm:spec_decode_num_drafts_total")
            if accepted is None or drafts is None:
                return None
            # vLLM's mean acceptance length counts the bonus token: 1 + accepted / drafts.
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
