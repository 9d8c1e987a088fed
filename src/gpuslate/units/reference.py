"""The same answer as before a park: a fixed prompt at temperature 0, answered when the unit first
became ready, must be answered with the same tokens after every resume.

Why: a park can give the memory back and the server still be wrong. SGLang releases its weights
rather than offloading them (#19442): after a resume they hold whatever the new memory held until
they are loaded from disk again; vLLM's level-2 wake maps them back empty; a checkpoint restored onto
the wrong pages would be worse. Readiness and a 1-token smoke completion pass on garbage weights;
greedy decoding of a fixed prompt does not (the text differs, or repeats one token).

The answer is kept in the unit's record (``reference``) by ``up`` (when the unit can park: see
:func:`wanted`) or, for a unit whose way to park was only known later, by its first ``park``
before anything is parked. Nothing here prints; every request is bounded (readiness.http).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from .._document import parse_json
from ..engines.commands import read_park
from ..options import ParkWay
from .readiness import http
from .spec import UnitSpec

#: the prompt (greedy decoding of it is the model's own words) and how many tokens are compared
PROMPT = "gpuslate reference answer. The capital of France is"
MAX_TOKENS = 16


def wanted(spec: UnitSpec, env: Mapping[str, str]) -> bool:
    """Whether ``up`` takes the reference once the unit is ready: a unit that says how it parks, or
    whose command its engine can park (``auto``). Others pay for no request at start; their first
    park takes it."""
    if spec.port is None:
        return False
    if spec.park in (ParkWay.LEVEL1, ParkWay.LEVEL2, ParkWay.CHECKPOINT):
        return True
    if spec.park is ParkWay.NONE:
        return False
    reading = read_park(spec.command, env)
    return reading is not None and bool(reading.usable())


def _model(spec: UnitSpec, timeout: float) -> str:
    if spec.model is not None:
        return spec.model
    status, body = http("GET", spec.url("/v1/models"), timeout=timeout)
    models = parse_json(body).get("data") or [] if status == 200 else []
    if not models:
        raise ValueError(f"/v1/models answered HTTP {status} with no model")
    return str(models[0]["id"])


#: the OpenAI APIs asked, in order: the completions API (the prompt as it is), else the chat API (a
#: server without the first: ``transformers serve`` has only ``/v1/chat/completions``)
APIS = ("completions", "chat")


def ask(spec: UnitSpec, timeout: float = 30.0, model: str | None = None, api: str | None = None,
        max_tokens: int = MAX_TOKENS) -> dict[str, Any]:
    """The unit's answer to :data:`PROMPT` at temperature 0: ``{prompt, model, api, max_tokens, text,
    tokens, taken_at, latency_s}``, through ``api`` (None: the first of :data:`APIS` the server has).
    Raises ValueError (or OSError) when it gives none."""
    t0 = time.monotonic()
    model = model or _model(spec, timeout)
    for which in (api,) if api is not None else APIS:
        chat = which == "chat"
        path = "/v1/chat/completions" if chat else "/v1/completions"
        body: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "temperature": 0, "seed": 0}
        body.update({"messages": [{"role": "user", "content": PROMPT}]} if chat else {"prompt": PROMPT})
        status, raw = http("POST", spec.url(path), timeout=max(0.1, timeout - (time.monotonic() - t0)), body=body)
        if status in (404, 405) and api is None and not chat:
            continue  # no completions API here: the chat one
        if status != 200:
            raise ValueError(f"{path} answered HTTP {status}: {raw[:200].decode('utf-8', 'replace')}")
        doc = parse_json(raw)
        choices = doc.get("choices")
        first = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
        text = (first.get("message") or {}).get("content") if chat and isinstance(first.get("message"), dict) \
            else first.get("text")
        if not isinstance(text, str):
            raise ValueError(f"{path} returned no text")
        usage = doc.get("usage") if isinstance(doc.get("usage"), dict) else {}
        tokens = usage.get("completion_tokens")
        return {"prompt": PROMPT, "model": model, "api": which, "max_tokens": max_tokens, "text": text,
                "tokens": tokens if isinstance(tokens, int) and not isinstance(tokens, bool) else None,
                "taken_at": time.time(), "latency_s": round(time.monotonic() - t0, 4)}
    raise ValueError("the server has neither /v1/completions nor /v1/chat/completions")


def warm_up(spec: UnitSpec, ref: Mapping[str, Any] | None, timeout: float = 30.0) -> dict[str, Any]:
    """One 1-token completion through the API the reference was asked through (the first request
    after a wake is several times slower without one: vLLM's blog): ``{ok, latency_s, error}``."""
    t0 = time.monotonic()
    try:
        ask(spec, timeout, model=str(ref.get("model") or "") or None if ref else None,
            api=str(ref.get("api") or "") or None if ref else None, max_tokens=1)
        return {"ok": True, "latency_s": round(time.monotonic() - t0, 4), "error": None}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        return {"ok": False, "latency_s": round(time.monotonic() - t0, 4), "error": str(exc)}


def take(spec: UnitSpec, timeout: float = 30.0) -> dict[str, Any] | str:
    """The reference answer, or why it could not be had (never raises)."""
    try:
        return ask(spec, timeout)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        return f"the reference completion failed: {exc}"


def compare(spec: UnitSpec, ref: Mapping[str, Any], timeout: float = 30.0) -> tuple[bool, str, dict[str, Any] | None]:
    """Ask again and compare with ``ref``: (same answer, a sentence, the answer got or None)."""
    try:
        got = ask(spec, timeout, model=str(ref.get("model") or "") or None, api=str(ref.get("api") or "") or None)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        return False, f"the reference completion failed after the resume: {exc}", None
    if got["text"] == ref.get("text"):
        return True, f"the same {got['tokens'] or MAX_TOKENS} tokens as when it first became ready", got
    return False, (f"a different answer to the reference prompt at temperature 0 than when it first became ready "
                   f"(its weights did not come back as they were): {_short(got['text'])!r}, expected "
                   f"{_short(str(ref.get('text')))!r}"), got


def _short(text: str) -> str:
    return text if len(text) <= 80 else text[:77] + "..."
