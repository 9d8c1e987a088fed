"""Wire formats of the simulated server: request parsing and response bodies.

OpenAI completions and chat completions, plus SGLang's native ``/generate``
(the default backend of ``sglang.bench_serving``). Pure functions only, so
the HTTP layer stays about timing and connections. The shapes follow what
SGLang and vLLM return, because their clients are what will talk to the
simulator.
"""

from __future__ import annotations

import math
import time
import uuid
from dataclasses import dataclass, replace
from typing import Any, Literal

Kind = Literal["completion", "chat", "generate"]

# OpenAI's legacy completions endpoint generates 16 tokens when max_tokens is absent.
COMPLETIONS_DEFAULT_MAX_TOKENS = 16
# SGLang's SamplingParams default for max_new_tokens.
GENERATE_DEFAULT_MAX_TOKENS = 128

_FILLER = (
    "the quick brown fox jumps over a lazy dog while simulated accelerators "
    "hum along and batches of tokens stream out in tidy deterministic order"
).split()


class BadRequest(ValueError):
    """A request body the real engines would answer with 400."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


@dataclass(frozen=True)
class GenerationSpec:
    """What one parsed request asks the scheduler for."""

    kind: Kind
    prompt_tokens: int
    tokens: int  # how many tokens will actually be generated
    finish_reason: Literal["length", "stop"]
    stream: bool
    include_usage: bool
    continuous_usage: bool = False  # vLLM's stream_options.continuous_usage_stats: usage on every chunk


def count_prompt_tokens(text: str) -> int:
    """The usual ~4 characters per token, rounded up, never below 1."""
    return max(1, math.ceil(len(text) / 4))


def filler_text(start: int, count: int, seed: int = 0) -> str:
    """Text of generated tokens ``start .. start+count-1``: one word per token, the same for the
    same request every time (greedy decoding of a fixed model). ``seed`` is the state of the
    weights (simserver/parkmodel.py): 0, the model's own words; -1, weights that are zeros (the
    same word at every position, as an argmax over zero logits); any other, weights that are
    garbage: other words, drawn from the same vocabulary (so token counts hold)."""
    words = []
    for i in range(start, start + count):
        if seed == 0:
            word = _FILLER[i % len(_FILLER)]
        elif seed == -1:
            word = _FILLER[0]
        else:
            word = _FILLER[_mix(seed, i) % len(_FILLER)]
        words.append(word if i == 0 else " " + word)
    return "".join(words)


def _mix(seed: int, i: int) -> int:
    """splitmix64 of (seed, position): a cheap, well-spread word choice per position."""
    z = (seed * 0x9E3779B97F4A7C15 + i * 0xBF58476D1CE4E5B9 + 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return z ^ (z >> 31)


def error_body(message: str, *, type_: str = "invalid_request_error",
               param: str | None = None, code: int | str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


# OpenAI-style error types of the HTTP errors the routing layer raises itself.
_HTTP_ERROR_TYPES = {404: "not_found_error", 405: "invalid_request_error",
                     413: "invalid_request_error"}


def http_error_body(status: int, reason: str, detail: str | None = None) -> dict[str, Any]:
    """The OpenAI-shaped body of an error the HTTP layer raised (unknown route, wrong method,
    body too large, ...): real clients parse ``error.message`` from every error."""
    type_ = _HTTP_ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
    return error_body(detail or reason, type_=type_, code=status)


def model_not_found_body(model: str) -> dict[str, Any]:
    """vLLM's wording for a model it does not serve, with OpenAI's ``code``."""
    return error_body(f"The model `{model}` does not exist.", param="model", code="model_not_found")


def requested_model(body: Any) -> str | None:
    """The ``model`` a completions or chat request names (None: not given, the served one)."""
    model = body.get("model") if isinstance(body, dict) else None
    if model is not None and not isinstance(model, str):
        raise BadRequest("'model' must be a string", "model")
    return model or None


def _opt_bool(body: dict[str, Any], name: str) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise BadRequest(f"'{name}' must be a boolean", name)
    return value


def _opt_int(body: dict[str, Any], name: str, minimum: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"'{name}' must be an integer", name)
    if value < minimum:
        raise BadRequest(f"'{name}' must be at least {minimum}, got {value}", name)
    return value


def _completion_prompt_tokens(prompt: Any, name: str = "prompt") -> int:
    if isinstance(prompt, str):
        return count_prompt_tokens(prompt)
    if isinstance(prompt, list) and prompt:
        if all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return max(1, len(prompt))  # already token ids
        if len(prompt) == 1:
            return _completion_prompt_tokens(prompt[0], name)
        raise BadRequest("batched prompts (a list of several prompts) are not supported "
                         "by the simulator; send one request per prompt", name)
    raise BadRequest(f"'{name}' must be a string, a list of token ids, or a list "
                     "holding one of those", name)


def _chat_prompt_tokens(messages: Any) -> int:
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list", "messages")
    chars = 0
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
            raise BadRequest(f"messages[{i}] must be an object with a string 'role'", "messages")
        content = msg.get("content")
        if content is None or isinstance(content, str):
            chars += len(content or "")
        elif isinstance(content, list):
            for part in content:
                if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                    raise BadRequest(f"messages[{i}].content parts must be objects with a 'type'",
                                     "messages")
                text = part.get("text")
                chars += len(text) if part["type"] == "text" and isinstance(text, str) else 0
        else:
            raise BadRequest(f"messages[{i}].content must be a string, a list of parts or null",
                             "messages")
    return max(1, math.ceil(chars / 4))


def parse_request(kind: Kind, body: Any, *, context_length: int,
                  eos_after_tokens: int) -> GenerationSpec:
    """Validate a completions, chat or ``/generate`` body and decide how many tokens it gets."""
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    if kind == "generate":
        return _parse_generate(body, context_length=context_length,
                               eos_after_tokens=eos_after_tokens)
    if kind == "completion":
        if "prompt" not in body:
            raise BadRequest("'prompt' is required", "prompt")
        prompt_tokens = _completion_prompt_tokens(body["prompt"])
        max_tokens = _opt_int(body, "max_tokens", 1)
        if max_tokens is None:
            max_tokens = COMPLETIONS_DEFAULT_MAX_TOKENS
    else:
        prompt_tokens = _chat_prompt_tokens(body.get("messages"))
        # Newer OpenAI clients send max_completion_tokens; vLLM prefers it too.
        max_tokens = _opt_int(body, "max_completion_tokens", 1)
        if max_tokens is None:
            max_tokens = _opt_int(body, "max_tokens", 1)
        if max_tokens is None:
            max_tokens = max(1, context_length - prompt_tokens)
    n = _opt_int(body, "n", 1)
    if n not in (None, 1):
        raise BadRequest("the simulator supports only n=1", "n")
    stream = _opt_bool(body, "stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise BadRequest("'stream_options' must be an object", "stream_options")
    if options and not stream:
        raise BadRequest("'stream_options' is only allowed when 'stream' is true", "stream_options")
    include_usage = _opt_bool(options or {}, "include_usage")
    spec = _decide(kind, prompt_tokens, max_tokens, stream=stream, include_usage=include_usage,
                   ignore_eos=_opt_bool(body, "ignore_eos"),
                   min_tokens=_opt_int(body, "min_tokens", 0) or 0,
                   context_length=context_length, eos_after_tokens=eos_after_tokens)
    if _opt_bool(options or {}, "continuous_usage_stats"):
        spec = replace(spec, continuous_usage=True)
    return spec


def _parse_generate(body: dict[str, Any], *, context_length: int,
                    eos_after_tokens: int) -> GenerationSpec:
    if "text" in body:
        prompt_tokens = _completion_prompt_tokens(body["text"], "text")
    elif "input_ids" in body:
        prompt_tokens = _completion_prompt_tokens(body["input_ids"], "input_ids")
    else:
        raise BadRequest("'text' or 'input_ids' is required", "text")
    params = body.get("sampling_params") or {}
    if not isinstance(params, dict):
        raise BadRequest("'sampling_params' must be an object", "sampling_params")
    max_tokens = _opt_int(params, "max_new_tokens", 1)
    return _decide("generate", prompt_tokens,
                   GENERATE_DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens,
                   stream=_opt_bool(body, "stream"), include_usage=False,
                   ignore_eos=_opt_bool(params, "ignore_eos"),
                   min_tokens=_opt_int(params, "min_new_tokens", 0) or 0,
                   context_length=context_length, eos_after_tokens=eos_after_tokens)


def _decide(kind: Kind, prompt_tokens: int, max_tokens: int, *, stream: bool, include_usage: bool,
            ignore_eos: bool, min_tokens: int, context_length: int,
            eos_after_tokens: int) -> GenerationSpec:
    if prompt_tokens + max_tokens > context_length:
        # Same wording as vLLM, so a dry run fails the way the real one would.
        raise BadRequest(
            f"This model's maximum context length is {context_length} tokens. However, you "
            f"requested {prompt_tokens + max_tokens} tokens ({prompt_tokens} in the messages, "
            f"{max_tokens} in the completion). Please reduce the length of the messages or "
            "completion.", "max_tokens")
    # Without ignore_eos the simulated model "emits EOS" after a fixed length,
    # so benchmark clients that need exact lengths must send ignore_eos as usual.
    natural = max(eos_after_tokens, min_tokens)
    if ignore_eos or max_tokens <= natural:
        return GenerationSpec(kind, prompt_tokens, max_tokens, "length", stream, include_usage)
    return GenerationSpec(kind, prompt_tokens, natural, "stop", stream, include_usage)


class ResponseBuilder:
    """Builds the JSON objects of one response, streamed or not."""

    def __init__(self, kind: Kind, model: str) -> None:
        self.kind = kind
        self.model = model
        prefix = {"completion": "cmpl", "chat": "chatcmpl", "generate": "gen"}[kind]
        self.id = f"{prefix}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.object = "text_completion" if kind == "completion" else "chat.completion"

    def _envelope(self, obj: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created,
                "model": self.model, "choices": choices}

    @staticmethod
    def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
        return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens}

    def full(self, text: str, finish_reason: str, usage: dict[str, int]) -> dict[str, Any]:
        if self.kind == "completion":
            choice: dict[str, Any] = {"index": 0, "text": text, "logprobs": None,
                                      "finish_reason": finish_reason}
        else:
            choice = {"index": 0, "message": {"role": "assistant", "content": text},
                      "logprobs": None, "finish_reason": finish_reason}
        body = self._envelope(self.object, [choice])
        body["usage"] = usage
        return body

    def chunk(self, *, text: str | None = None, role: bool = False,
              finish_reason: str | None = None, with_usage_field: bool = False,
              usage: dict[str, int] | None = None) -> dict[str, Any]:
        """One SSE chunk; ``text=None`` with a finish reason makes the closing chunk; ``usage``
        (the counts so far) is vLLM's ``continuous_usage_stats``."""
        if self.kind == "completion":
            choice: dict[str, Any] = {"index": 0, "text": text or "", "logprobs": None,
                                      "finish_reason": finish_reason}
            body = self._envelope("text_completion", [choice])
        else:
            delta: dict[str, Any] = {}
            if role:
                delta["role"] = "assistant"
            if text is not None or role:
                delta["content"] = text or ""
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            body = self._envelope("chat.completion.chunk", [choice])
        if usage is not None:
            body["usage"] = usage
        elif with_usage_field:
            # OpenAI sends "usage": null on every chunk when include_usage is on.
            body["usage"] = None
        return body

    def usage_chunk(self, usage: dict[str, int]) -> dict[str, Any]:
        obj = "text_completion" if self.kind == "completion" else "chat.completion.chunk"
        body = self._envelope(obj, [])
        body["usage"] = usage
        return body

    def native(self, text: str, prompt_tokens: int, completion_tokens: int,
               finish_reason: str | None) -> dict[str, Any]:
        """SGLang ``/generate`` body; streamed chunks carry the text so far, not a delta."""
        reason: dict[str, Any] | None = None if finish_reason is None else {"type": finish_reason}
        if finish_reason == "length":
            reason = {"type": "length", "length": completion_tokens}
        return {"text": text, "meta_info": {
            "id": self.id, "finish_reason": reason, "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens, "cached_tokens": 0}, "index": 0}
