"""Prompts for ``gpuslate bench``: random ones of a given length, or a dataset file.

Without a tokenizer a prompt of exactly N tokens cannot be promised for every
model. Random prompts are made of common three-letter English words with a
leading space (" the", " and", ...): each is one token in the BPE vocabularies
of the Llama, Qwen and GPT families, and four characters, which is one token
by the ``ceil(chars / 4)`` rule of the simulated server. The server's
``usage.prompt_tokens`` is what the figures use, whenever it is reported.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from typing import Any

from .._walk import read_file
from ..errors import FileTooLarge, PermissionDenied, UsageError

_WORDS = (
    " the and for not you all can had her was one our out day get has him his how man new now old"
    " see two way who boy did its let put say she too use any ask big buy car cut dog end eye far"
    " few fly fun got hot job key law lot low map may mix net off oil own pay red run sea set sit"
    " six sky son sun ten top try war win yes yet"
).split(" ")[1:]
WORDS: tuple[str, ...] = tuple(" " + w for w in _WORDS)

MAX_DATASET_BYTES = 1 << 30


@dataclass(frozen=True)
class Prompt:
    """One request's input: ``text`` for completions; chat sends it as one user message."""

    text: str
    output_len: int
    input_len: int | None = None  # the intended length; the server's count wins


def random_prompt(rng: random.Random, input_len: int) -> str:
    # choices(k=) draws all words in one call: a fifth of the time of a choice() per word, which was
    # a tenth of the load generator's CPU per request of 128 tokens
    return "".join(rng.choices(WORDS, k=input_len))


def random_prompts(count: int, input_len: int, output_len: int, seed: int) -> list[Prompt]:
    rng = random.Random(seed)
    return [Prompt(random_prompt(rng, input_len), output_len, input_len) for _ in range(count)]


def _sharegpt_prompt(record: Any) -> str | None:
    turns = record.get("conversations") if isinstance(record, dict) else None
    if not isinstance(turns, list):
        return None
    for turn in turns:
        if isinstance(turn, dict) and turn.get("from") in ("human", "user"):
            value = turn.get("value")
            if isinstance(value, str) and value:
                return value
    return None


def _record_prompt(record: Any, where: str, output_len: int) -> Prompt | None:
    """A prompt from ``{"prompt": ...}`` or a ShareGPT record; None for a ShareGPT record with
    no human turn (the reference tools skip those too)."""
    if isinstance(record, dict) and "prompt" in record:
        text = record["prompt"]
        if not isinstance(text, str) or not text:
            raise UsageError(f"{where}: 'prompt' must be a non-empty string")
        length = record.get("output_len", record.get("max_tokens", output_len))
        if isinstance(length, bool) or not isinstance(length, int) or length < 1:
            raise UsageError(f"{where}: 'output_len' must be a positive integer")
        return Prompt(text, length)
    if isinstance(record, dict) and "conversations" in record:
        text = _sharegpt_prompt(record)
        return None if text is None else Prompt(text, output_len)
    raise UsageError(f"{where}: expected an object with 'prompt' or ShareGPT 'conversations'")


def load_dataset(path: str, output_len: int) -> list[Prompt]:
    """Prompts of a JSONL file (``{"prompt": ..., "output_len"?: N}`` per line) or of a
    ShareGPT JSON file (a list of ``{"conversations": [{"from": "human", "value": ...}, ...]}``).

    Every ShareGPT prompt gets ``output_len`` tokens (with ``ignore_eos``), so that runs are
    comparable across servers. Errors name ``FILE:LINE``.
    """
    try:  # the walk: a regular file only (a FIFO never hangs), never another user's link, bounded
        text = read_file(path, limit=MAX_DATASET_BYTES, what="dataset").decode("utf-8")
    except FileNotFoundError:
        raise UsageError(f"{path}: no such dataset file") from None
    except FileTooLarge:
        raise UsageError(f"{path}: dataset larger than 1 GiB") from None
    except PermissionDenied as exc:
        raise UsageError(f"{path}: cannot read dataset: {exc}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: cannot read dataset: {exc}") from None
    prompts: list[Prompt] = []
    if text.lstrip().startswith("["):
        try:
            records = json.loads(text)
        except json.JSONDecodeError as exc:
            raise UsageError(f"{path}:{exc.lineno}: invalid JSON: {exc.msg}") from None
        except RecursionError:  # checked while parsing: a dataset nests a few levels
            raise UsageError(f"{path}: invalid JSON: nested too deeply") from None
        for i, record in enumerate(records):
            prompt = _record_prompt(record, f"{path}: record {i}", output_len)
            if prompt is not None:
                prompts.append(prompt)
    else:
        for lineno, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise UsageError(f"{path}:{lineno}: invalid JSON: {exc.msg}") from None
            except RecursionError:
                raise UsageError(f"{path}:{lineno}: invalid JSON: nested too deeply") from None
            prompt = _record_prompt(record, f"{path}:{lineno}", output_len)
            if prompt is not None:
                prompts.append(prompt)
    if not prompts:
        raise UsageError(f"{path}: the dataset holds no prompts")
    return prompts


def length_range(length: int, ratio: float) -> tuple[int, int]:
    """vLLM's ``--random-range-ratio``: lengths uniform in ``[L * (1 - r), L * (1 + r)]``,
    at least 1 (r = 0: exactly L). SGLang's flag of the same name sets only a lower bound."""
    return max(1, math.floor(length * (1 - ratio))), max(1, math.ceil(length * (1 + ratio)))


class PromptSource:
    """Hands out prompts in a reproducible order: random ones, or the dataset shuffled by seed."""

    def __init__(self, *, input_len: int, output_len: int, seed: int,
                 dataset: list[Prompt] | None = None, range_ratio: float = 0.0) -> None:
        self.input_len = input_len
        self.output_len = output_len
        self.range_ratio = range_ratio
        self._rng = random.Random(seed)
        self._dataset = list(dataset) if dataset else None
        if self._dataset:
            self._rng.shuffle(self._dataset)
        self._next = 0

    def take(self) -> Prompt:
        if self._dataset:
            prompt = self._dataset[self._next % len(self._dataset)]
            self._next += 1
            return prompt
        if self.range_ratio:
            n_in = self._rng.randint(*length_range(self.input_len, self.range_ratio))
            n_out = self._rng.randint(*length_range(self.output_len, self.range_ratio))
            return Prompt(random_prompt(self._rng, n_in), n_out, n_in)
        return Prompt(random_prompt(self._rng, self.input_len), self.output_len, self.input_len)

    @property
    def distinct(self) -> int | None:
        """How many different prompts there are to hand out (None: unbounded)."""
        return len(self._dataset) if self._dataset else None
