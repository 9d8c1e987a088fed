"""`gpuslate sim serve` as a real subprocess for the load-generator tests (imported by them)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from helpers import gpuslate_env

READY = "The server is fired up and ready to roll!"


class SimProc:
    """A running ``sim serve``; a thread drains its stderr into ``log`` (a full pipe would stall it)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.url = ""
        self.log: list[str] = []
        self.ready = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log.append(line.rstrip("\n"))
            if "listening on " in line and not self.url:
                self.url = line.split("listening on ")[1].split()[0]
            if READY in line:
                self.ready.set()
        self.ready.set()  # exited: wake the waiter, which then sees no READY line

    def info(self) -> dict[str, Any]:
        with urllib.request.urlopen(self.url + "/get_server_info", timeout=10) as r:
            return json.loads(r.read())

    def counters(self) -> dict[str, Any]:
        return self.info()["counters"]

    def stop(self) -> str:
        """SIGTERM, wait, and return its whole log (stderr)."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self._reader.join(10)
        return "\n".join(self.log)


@contextmanager
def sim_serve(*args: str) -> Iterator[SimProc]:
    """Start ``gpuslate sim serve --port 0 --startup-seconds 0 ARGS`` and wait until it is ready."""
    proc = subprocess.Popen([sys.executable, "-m", "gpuslate", "sim", "serve", "--port", "0",
                             "--startup-seconds", "0", *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=gpuslate_env(), start_new_session=True)
    sim = SimProc(proc)
    try:
        if not sim.ready.wait(30) or proc.poll() is not None or not sim.url:
            raise AssertionError("sim serve did not become ready:\n" + "\n".join(sim.log))
        yield sim
    finally:
        sim.stop()


def word_tokenizer(folder: Path) -> Path:
    """A tiny tokenizer.json made here (nothing downloaded): one token per word, so it counts the
    simulator's filler text (one word per token) and the random prompts exactly."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from gpuslate.bench.prompts import WORDS
    from gpuslate.simserver.openai_api import _FILLER

    vocab = {"[UNK]": 0}
    for word in [*(w.strip() for w in WORDS), *_FILLER]:
        vocab.setdefault(word, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    path = folder / "tokenizer.json"
    tok.save(str(path))
    return path
