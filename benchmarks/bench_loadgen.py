"""Is `gpuslate bench` the bottleneck? Measured side by side with SGLang's `bench_serving`.

Against `gpuslate sim serve --time-scale 1e9` (generation practically free:
the server streams as fast as its event loop can), at concurrency 256 on the
machine at hand, each client is run in interleaved rounds as a separate
process; for each run we record the requests/s and streamed output tokens/s
the client reports, and the client process's own user+sys CPU seconds (from
``wait4``). CPU per request is the *marginal* cost: the difference between a
long run (``--requests``) and a short one (``--short``) divided by the
difference in requests, so interpreter start-up and imports (transformers,
for SGLang) cancel out.

SGLang's client runs unmodified through ``benchmarks/sglang_bench_serving.py``
(which only skips the torch-importing package ``__init__`` files) in a
virtual environment given by ``--sglang-python``, with
``--backend sglang-oai`` (the same ``/v1/completions`` streaming endpoint
gpuslate uses), ``--dataset-name random-ids`` and a generated word-level
tokenizer whose words are one simulator token each, so both clients send
128-token prompts and ask for 128 tokens with ``ignore_eos``.

    python benchmarks/bench_loadgen.py --sglang-python /tmp/sglbench/venv/bin/python \
        --out benchmarks/results/cpu-loadgen.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
sys.path.insert(0, str(SRC))

from gpuslate.bench.prompts import WORDS  # noqa: E402

READY = "The server is fired up and ready to roll!"


def write_tokenizer(folder: Path) -> None:
    """A word-level Hugging Face tokenizer over gpuslate's prompt words (no download needed)."""
    words = [w.strip() for w in WORDS]
    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(words)}}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.json").write_text(json.dumps({
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": 0, "content": "[UNK]", "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True}],
        "normalizer": None, "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": None,
        "decoder": None, "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"}}))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "[UNK]", "model_max_length": 1 << 20}))


class Server:
    def __init__(self, args: list[str]) -> None:
        env = {**os.environ, "PYTHONPATH": str(SRC)}
        self.proc = subprocess.Popen([sys.executable, "-m", "gpuslate", "sim", "serve", "--port", "0",
                                      "--startup-seconds", "0", *args],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
        self.url = ""
        self.log: list[str] = []
        ready = threading.Event()

        def read() -> None:
            assert self.proc.stderr is not None
            for line in self.proc.stderr:
                self.log.append(line.rstrip())
                if "listening on " in line and not self.url:
                    self.url = line.split("listening on ")[1].split()[0]
                if READY in line:
                    ready.set()
            ready.set()

        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(30) or self.proc.poll() is not None:
            raise RuntimeError("sim serve did not start:\n" + "\n".join(self.log))

    def cpu_seconds(self) -> float:
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(15)


def run_client(cmd: list[str], env: dict[str, str]) -> tuple[float, float, str]:
    """Run one client; (wall s, user+sys CPU s of that process tree, stdout)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    out, err = b"", b""
    # communicate() reaps the child; wait4 must, to get its rusage: read first, then reap.
    assert proc.stdout is not None and proc.stderr is not None
    err_chunks: list[bytes] = []
    t = threading.Thread(target=lambda: err_chunks.append(proc.stderr.read()), daemon=True)  # type: ignore[union-attr]
    t.start()
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    t.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = b"".join(err_chunks)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[:4]} exited {proc.returncode}: {err.decode()[-2000:]}")
    return wall, usage.ru_utime + usage.ru_stime, out.decode()


def gpuslate_cmd(url: str, n: int, c: int, in_len: int, out_len: int) -> list[str]:
    return [sys.executable, "-m", "gpuslate", "bench", url, "-c", str(c), "-n", str(n),
            "--input-len", str(in_len), "--output-len", str(out_len), "--json"]


def sglang_cmd(py: str, url: str, n: int, c: int, in_len: int, out_len: int, tok: Path, out: Path) -> list[str]:
    return [py, str(ROOT / "benchmarks" / "sglang_bench_serving.py"), "--backend", "sglang-oai",
            "--base-url", url, "--model", "sim-model", "--tokenizer", str(tok),
            "--dataset-name", "random-ids", "--random-input-len", str(in_len), "--random-output-len",
            str(out_len), "--random-range-ratio", "1.0", "--num-prompts", str(n), "--max-concurrency", str(c),
            "--request-rate", "inf", "--disable-tqdm", "--seed", "1", "--ready-check-timeout-sec", "0",
            "--warmup-requests", "1", "--output-file", str(out)]


def parse_gpuslate(stdout: str) -> dict[str, float]:
    lv = json.loads(stdout)["levels"][0]
    assert lv["failed"] == 0, lv["errors"]
    return {"completed": lv["completed"], "duration_s": lv["duration_s"],
            "request_throughput": lv["request_throughput"], "output_token_throughput": lv["output_token_throughput"],
            "output_tokens": lv["output_tokens"]}


def parse_sglang(path: Path) -> dict[str, float]:
    doc = json.loads(path.read_text().strip().splitlines()[-1])
    assert doc["completed"] > 0
    return {"completed": doc["completed"], "duration_s": doc["duration"],
            "request_throughput": doc["request_throughput"], "output_token_throughput": doc["output_throughput"],
            "output_tokens": doc["total_output_tokens"]}


def run_phase(name: str, server_args: list[str], sizes: tuple[int, ...], a: argparse.Namespace,
              tok: Path, tmp: Path) -> list[dict[str, Any]]:
    """Every client at every size, once per round, in alternating order, against one server."""
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    # The SGLang client asks the Hugging Face hub about the model name unless told it is offline.
    sg_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    sg_env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    runs: list[dict[str, Any]] = []
    server = Server(server_args)
    try:
        clients = ("gpuslate", "sglang")
        for r in range(a.rounds):
            for client in (clients if r % 2 == 0 else clients[::-1]):
                for n in sizes:
                    out = tmp / f"sg-{name}-{r}-{n}.jsonl"
                    cmd = gpuslate_cmd(server.url, n, a.concurrency, a.input_len, a.output_len) \
                        if client == "gpuslate" else \
                        sglang_cmd(a.sglang_python, server.url, n, a.concurrency, a.input_len, a.output_len, tok, out)
                    s0 = server.cpu_seconds()
                    wall, cpu, stdout = run_client(cmd, env if client == "gpuslate" else sg_env)
                    server_cpu = server.cpu_seconds() - s0
                    figures = parse_gpuslate(stdout) if client == "gpuslate" else parse_sglang(out)
                    run = {"phase": name, "client": client, "round": r, "requests": n, "wall_s": round(wall, 3),
                           "client_cpu_s": round(cpu, 3), "server_cpu_s": round(server_cpu, 3), **figures}
                    runs.append(run)
                    print(json.dumps(run), flush=True)
    finally:
        server.stop()
    return runs


def _median(runs: list[dict[str, Any]], key: str) -> float:
    return statistics.median(x[key] for x in runs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sglang-python", required=True, help="python of a venv with sglang installed --no-deps")
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--requests", type=int, default=2048, help="requests of a long zero-delay run")
    ap.add_argument("--short", type=int, default=512, help="requests of a short zero-delay run")
    ap.add_argument("--modelled-requests", type=int, default=512)
    ap.add_argument("--time-scale", type=float, default=5.0, help="of the modelled-load phase")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", help="write the JSON results here")
    a = ap.parse_args()

    from gpuslate.simserver.perfmodel import throughput

    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        tok = tmp / "tokenizer"
        write_tokenizer(tok)
        mr = str(max(256, a.concurrency))
        zero = run_phase("zero_delay", ["--time-scale", "1e9", "--max-running-requests", mr],
                         (a.short, a.requests), a, tok, tmp)
        modelled = run_phase("modelled", ["--time-scale", str(a.time_scale), "--max-running-requests", mr],
                             (a.modelled_requests,), a, tok, tmp)

    model_tps = throughput("baseline", a.concurrency, prompt_tokens=a.input_len,
                           output_tokens=a.output_len) * a.time_scale
    summary: dict[str, Any] = {"zero_delay": {}, "modelled": {"model_output_token_throughput": round(model_tps, 1)}}
    for client in ("gpuslate", "sglang"):
        long = [x for x in zero if x["client"] == client and x["requests"] == a.requests]
        short = {x["round"]: x for x in zero if x["client"] == client and x["requests"] == a.short}
        marginal = [(x["client_cpu_s"] - short[x["round"]]["client_cpu_s"]) / (a.requests - a.short) for x in long]
        summary["zero_delay"][client] = {
            "request_throughput_median": round(_median(long, "request_throughput"), 2),
            "output_token_throughput_median": round(_median(long, "output_token_throughput"), 1),
            "client_cpu_ms_per_request_median": round(1000 * statistics.median(marginal), 3),
            "client_cpu_ms_per_request_runs": [round(1000 * m, 3) for m in marginal],
            "server_cpu_ms_per_request_median": round(1000 * statistics.median(
                x["server_cpu_s"] / x["completed"] for x in long), 3),
        }
        mod = [x for x in modelled if x["client"] == client]
        tps = _median(mod, "output_token_throughput")
        summary["modelled"][client] = {
            "request_throughput_median": round(_median(mod, "request_throughput"), 2),
            "output_token_throughput_median": round(tps, 1),
            "output_token_throughput_runs": [round(x["output_token_throughput"], 1) for x in mod],
            "vs_model": round(tps / model_tps, 3),
        }
    z, m = summary["zero_delay"], summary["modelled"]
    summary["ratio_gpuslate_over_sglang"] = {
        "zero_delay_output_token_throughput": round(
            z["gpuslate"]["output_token_throughput_median"] / z["sglang"]["output_token_throughput_median"], 3),
        "zero_delay_request_throughput": round(
            z["gpuslate"]["request_throughput_median"] / z["sglang"]["request_throughput_median"], 3),
        "zero_delay_client_cpu_per_request": round(
            z["gpuslate"]["client_cpu_ms_per_request_median"] / z["sglang"]["client_cpu_ms_per_request_median"], 3),
        "modelled_output_token_throughput": round(
            m["gpuslate"]["output_token_throughput_median"] / m["sglang"]["output_token_throughput_median"], 3),
    }
    meta = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": platform.node(),
            "cpus": os.cpu_count(), "python": platform.python_version(), "concurrency": a.concurrency,
            "requests": a.requests, "short": a.short, "modelled_requests": a.modelled_requests,
            "time_scale": a.time_scale, "input_len": a.input_len, "output_len": a.output_len,
            "rounds": a.rounds, "command": " ".join(sys.argv)}
    doc = {"meta": meta, "summary": summary, "runs": zero + modelled}
    print(json.dumps({"summary": summary}, indent=2))
    if a.out:
        Path(a.out).write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
