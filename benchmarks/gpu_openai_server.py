"""A real OpenAI-compatible streaming server on a GPU, for benchmarking the benchmark clients.

The device machine has torch and transformers but no internet, so the model
is a randomly initialised Llama-shaped network built from a ``LlamaConfig``
(the weights are noise; the compute, memory traffic and KV cache are those of
a real Llama of that shape). Decoding is greedy with a KV cache
(``model.generate``), and requests are batched statically: the scheduler takes
up to ``--max-batch`` waiting requests, left-pads their prompts, prefills them
together and decodes the batch until its longest request is done; requests
that arrive meanwhile wait for the next batch. Every step's new tokens are
streamed to their clients as they are produced.

Tokens are words: a prompt's tokens are its whitespace-separated words (each
mapped to a vocabulary id by a stable hash), and token ``i`` is written as the
word ``WORDS[i % len(WORDS)]`` with a leading space, so that clients that
count words, or re-tokenize with a word-level tokenizer, agree with the
server's ``usage`` exactly.

Endpoints: ``GET /health``, ``GET /v1/models``, ``POST /v1/completions`` and
``POST /v1/chat/completions`` (``max_tokens`` / ``max_completion_tokens``,
``stream``, ``stream_options.include_usage``, ``ignore_eos``), every error an
OpenAI-shaped JSON body.

    python benchmarks/gpu_openai_server.py --port 8000 --size 1b      # on the H200
    python benchmarks/gpu_openai_server.py --port 8000 --size tiny --device cpu   # a dry run
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import threading
import time
import uuid
import zlib
from dataclasses import dataclass, field
from typing import Any

import torch
from aiohttp import web
from transformers import LlamaConfig, LlamaForCausalLM, StoppingCriteria, StoppingCriteriaList

WORDS = ("the and for not you all can had her was one our out day get has him his how man new now old see two"
         " way who boy did its let put say she too use").split()

SIZES: dict[str, dict[str, int]] = {
    # TinyLlama-1.1B's shape
    "1b": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
               num_key_value_heads=4, vocab_size=32000),
    "small": dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16,
                  num_key_value_heads=4, vocab_size=32000),
    "tiny": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=1024),
}


def error(status: int, message: str, type_: str = "invalid_request_error", code: Any = None) -> web.Response:
    return web.json_response({"error": {"message": message, "type": type_, "param": None,
                                        "code": status if code is None else code}}, status=status)


@dataclass(eq=False)
class Request:
    prompt_ids: list[int]
    max_tokens: int
    ignore_eos: bool
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[list[int] | None] = field(default_factory=asyncio.Queue)
    sent: int = 0
    finish_reason: str = "length"
    done: bool = False

    def push(self, token: int, eos: int | None) -> None:
        """Called from the generation thread with this request's token of the step."""
        if self.done:
            return
        if eos is not None and token == eos and not self.ignore_eos:
            self.finish_reason, self.done = "stop", True
            self.loop.call_soon_threadsafe(self.queue.put_nowait, None)
            return
        self.sent += 1
        self.loop.call_soon_threadsafe(self.queue.put_nowait, [token])
        if self.sent >= self.max_tokens:
            self.done = True
            self.loop.call_soon_threadsafe(self.queue.put_nowait, None)


class _StreamTokens(StoppingCriteria):
    """Hands each step's new token of every row to its request; stops when all are done."""

    def __init__(self, batch: list[Request], eos: int | None) -> None:
        self.batch = batch
        self.eos = eos

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs: Any) -> torch.BoolTensor:
        last = input_ids[:, -1].tolist()  # one device->host copy per step, as real servers do
        for req, token in zip(self.batch, last):
            req.push(token, self.eos)
        done = all(r.done for r in self.batch)
        return torch.full((input_ids.shape[0],), done, dtype=torch.bool, device=input_ids.device)


class Engine:
    def __init__(self, size: str, device: str, dtype: torch.dtype, max_batch: int, seed: int) -> None:
        torch.manual_seed(seed)
        cfg = LlamaConfig(**SIZES[size], max_position_embeddings=8192, bos_token_id=1, eos_token_id=2,
                          pad_token_id=0)
        with torch.device(device):  # initialise the random weights on the GPU directly
            self.model = LlamaForCausalLM(cfg).to(dtype).eval()
        # EOS is handled per request (ignore_eos); generate() itself never stops early.
        self.model.generation_config.eos_token_id = None
        self.model.generation_config.pad_token_id = 0
        self.device = device
        self.vocab = cfg.vocab_size
        self.eos = cfg.eos_token_id
        self.max_batch = max_batch
        self.gather_s = 0.01
        self.params = sum(p.numel() for p in self.model.parameters())
        self.waiting: list[Request] = []
        self.cond = threading.Condition()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def encode(self, text: str) -> list[int]:
        # ids 3.. keep clear of pad/bos/eos; a stable hash so a prompt always maps the same way
        return [3 + zlib.crc32(w.encode()) % (self.vocab - 3) for w in text.split()] or [1]

    @staticmethod
    def decode(tokens: list[int], first: bool) -> str:
        words = [WORDS[t % len(WORDS)] for t in tokens]
        return ("" if first else " ") + " ".join(words)

    def submit(self, req: Request) -> None:
        with self.cond:
            self.waiting.append(req)
            self.cond.notify()

    def _loop(self) -> None:
        while True:
            with self.cond:
                while not self.waiting:
                    self.cond.wait()
                # gather for a moment: the clients of a closed loop resubmit within about a
                # millisecond of each other when a batch ends, and a batch of one that starts
                # before the rest arrive would make them wait its whole decode
                deadline = time.monotonic() + self.gather_s
                while len(self.waiting) < self.max_batch and (left := deadline - time.monotonic()) > 0:
                    self.cond.wait(left)
                batch, self.waiting = self.waiting[: self.max_batch], self.waiting[self.max_batch:]
            try:
                self._run(batch)
            except Exception as exc:  # a failed batch fails its requests, not the server
                print(f"[gpu-server] batch of {len(batch)} failed: {exc!r}", file=sys.stderr, flush=True)
                for req in batch:
                    if not req.done:
                        req.finish_reason, req.done = "error", True
                        req.loop.call_soon_threadsafe(req.queue.put_nowait, None)

    @torch.inference_mode()
    def _run(self, batch: list[Request]) -> None:
        width = max(len(r.prompt_ids) for r in batch)
        ids = torch.zeros((len(batch), width), dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for i, r in enumerate(batch):  # left padding: every row's last prompt token is aligned
            ids[i, width - len(r.prompt_ids):] = torch.tensor(r.prompt_ids)
            mask[i, width - len(r.prompt_ids):] = 1
        self.model.generate(
            input_ids=ids.to(self.device), attention_mask=mask.to(self.device),
            max_new_tokens=max(r.max_tokens for r in batch), min_new_tokens=0, do_sample=False,
            eos_token_id=None, pad_token_id=0, use_cache=True,
            stopping_criteria=StoppingCriteriaList([_StreamTokens(batch, self.eos)]))


class Server:
    def __init__(self, engine: Engine, model_name: str, context: int) -> None:
        self.engine = engine
        self.model_name = model_name
        self.context = context
        self.started = int(time.time())

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{
            "id": self.model_name, "object": "model", "created": self.started, "owned_by": "gpuslate-bench",
            "max_model_len": self.context}]})

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        try:
            body = await request.json()
        except ValueError:
            return error(400, "request body is not valid JSON")
        if not isinstance(body, dict):
            return error(400, "request body must be a JSON object")
        if body.get("model") not in (None, self.model_name):
            return error(404, f"The model `{body.get('model')}` does not exist.", code="model_not_found")
        if chat:
            msgs = body.get("messages")
            if not isinstance(msgs, list) or not msgs:
                return error(400, "'messages' must be a non-empty list")
            text = " ".join(str(m.get("content") or "") for m in msgs if isinstance(m, dict))
            max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or 16
        else:
            text = body.get("prompt")
            if isinstance(text, list) and len(text) == 1:
                text = text[0]
            if not isinstance(text, str):
                return error(400, "'prompt' must be a string")
            max_tokens = body.get("max_tokens") or 16
        if not isinstance(max_tokens, int) or max_tokens < 1:
            return error(400, "'max_tokens' must be a positive integer")
        prompt_ids = self.engine.encode(text)
        if len(prompt_ids) + max_tokens > self.context:
            return error(400, f"This model's maximum context length is {self.context} tokens.")
        req = Request(prompt_ids, max_tokens, bool(body.get("ignore_eos")), asyncio.get_running_loop())
        self.engine.submit(req)
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        created = int(time.time())
        obj = "chat.completion.chunk" if chat else "text_completion"
        if not body.get("stream"):
            tokens: list[int] = []
            while (item := await req.queue.get()) is not None:
                tokens += item
            text_out = self.engine.decode(tokens, True) if tokens else ""
            choice = ({"index": 0, "message": {"role": "assistant", "content": text_out},
                       "finish_reason": req.finish_reason} if chat else
                      {"index": 0, "text": text_out, "logprobs": None, "finish_reason": req.finish_reason})
            return web.json_response({"id": rid, "object": "chat.completion" if chat else "text_completion",
                                      "created": created, "model": self.model_name, "choices": [choice],
                                      "usage": self._usage(req)})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        usage = bool((body.get("stream_options") or {}).get("include_usage"))

        async def send(payload: Any) -> None:
            data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
            await resp.write(f"data: {data}\n\n".encode())

        def chunk(text_out: str | None, finish: str | None) -> dict[str, Any]:
            if chat:
                delta = {} if text_out is None else {"content": text_out}
                choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish}
            else:
                choice = {"index": 0, "text": text_out or "", "logprobs": None, "finish_reason": finish}
            doc: dict[str, Any] = {"id": rid, "object": obj, "created": created, "model": self.model_name,
                                   "choices": [choice]}
            if usage:
                doc["usage"] = None
            return doc

        try:
            if chat:
                await send({**chunk("", None), "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                                            "finish_reason": None}]})
            first = True
            while (item := await req.queue.get()) is not None:
                await send(chunk(self.engine.decode(item, first), None))
                first = False
            await send(chunk(None, req.finish_reason))
            if usage:
                await send({"id": rid, "object": obj, "created": created, "model": self.model_name, "choices": [],
                            "usage": self._usage(req)})
            await send("[DONE]")
            await resp.write_eof()
        except ConnectionResetError:
            req.done = True  # the client left: its row keeps computing until the batch ends
        return resp

    @staticmethod
    def _usage(req: Request) -> dict[str, int]:
        return {"prompt_tokens": len(req.prompt_ids), "completion_tokens": req.sent,
                "total_tokens": len(req.prompt_ids) + req.sent}


@web.middleware
async def json_errors(request: web.Request, handler: Any) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return error(exc.status, f"{exc.reason}: {request.method} {request.path}")


def api_key_check(key: str | None) -> Any:
    """``--api-key``: /v1 routes want ``Authorization: Bearer KEY`` (as vLLM's --api-key)."""
    @web.middleware
    async def check(request: web.Request, handler: Any) -> web.StreamResponse:
        if key is not None and request.path.startswith("/v1") and \
                request.headers.get("Authorization", "") != f"Bearer {key}":
            return error(401, "Unauthorized", "authentication_error")
        return await handler(request)
    return check


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--size", choices=sorted(SIZES), default="1b")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default=None,
                    help="default: bfloat16 on a GPU, float32 on the CPU")
    ap.add_argument("--max-batch", type=int, default=256)
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--model-name", default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--api-key", default=None, help="answer /v1 requests only with this bearer key")
    a = ap.parse_args()
    dtype = getattr(torch, a.dtype or ("bfloat16" if a.device.startswith("cuda") else "float32"))
    t0 = time.time()
    engine = Engine(a.size, a.device, dtype, a.max_batch, a.seed)
    name = a.model_name or f"random-llama-{a.size}"
    print(f"[gpu-server] {name}: {engine.params / 1e6:.1f} M parameters, {dtype}, on {a.device} "
          f"({torch.cuda.get_device_name() if a.device.startswith('cuda') else 'cpu'}), "
          f"built in {time.time() - t0:.1f} s; torch {torch.__version__}", file=sys.stderr, flush=True)
    app = web.Application(middlewares=[json_errors, api_key_check(a.api_key)])
    srv = Server(engine, name, a.context)
    app.router.add_get("/health", srv.health)
    app.router.add_get("/v1/models", srv.models)
    app.router.add_post("/v1/completions", srv.completions)
    app.router.add_post("/v1/chat/completions", srv.chat)
    print(f"[gpu-server] listening on http://{a.host}:{a.port}", file=sys.stderr, flush=True)
    web.run_app(app, host=a.host, port=a.port, access_log=None, print=None, handler_cancellation=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
