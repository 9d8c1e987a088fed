"""Does gpuslate's per-token ITL agree with SGLang's `bench_serving`? (issue 17)

Against `gpuslate sim serve --mode speculative` (several tokens a streamed
chunk, so per-token ITL and the chunk gap differ ~3x), at each concurrency
both clients run in alternating order against one server, ``--rounds``
times: gpuslate's ``bench`` (OpenAI ``/v1/completions``, its ``itl_ms``)
and SGLang's client unmodified through ``benchmarks/sglang_bench_serving.py``
with its default backend ``--backend sglang`` (the native ``/generate``
stream, whose client divides each chunk gap by the chunk's new tokens:
``python/sglang/benchmark/backends/sglang_client.py``), ``--request-rate inf
--max-concurrency C``. The figure compared is the mean ITL (ms) and the
median; the table is the median over rounds of gpuslate / SGLang.

    python benchmarks/bench_itl_sglang.py --sglang-python /tmp/sglbench-ab/venv/bin/python \
        --out benchmarks/results/cpu-itl-sglang.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_loadgen import ROOT, SRC, Server, run_client, write_tokenizer


def gpuslate_cmd(url: str, n: int, c: int, a: argparse.Namespace) -> list[str]:
    return [sys.executable, "-m", "gpuslate", "bench", url, "-c", str(c), "-n", str(n), "--warmup", "1",
            "--warmup-first-only", "--input-len", str(a.input_len), "--output-len", str(a.output_len), "--json"]


def sglang_cmd(url: str, n: int, c: int, a: argparse.Namespace, tok: Path, out: Path) -> list[str]:
    return [a.sglang_python, str(ROOT / "benchmarks" / "sglang_bench_serving.py"), "--backend", "sglang",
            "--base-url", url, "--model", "sim-model", "--tokenizer", str(tok),
            "--dataset-name", "random-ids", "--random-input-len", str(a.input_len), "--random-output-len",
            str(a.output_len), "--random-range-ratio", "1.0", "--num-prompts", str(n), "--max-concurrency", str(c),
            "--request-rate", "inf", "--disable-tqdm", "--seed", "1", "--ready-check-timeout-sec", "0",
            "--warmup-requests", "1", "--output-file", str(out)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sglang-python", required=True, help="python of a venv with sglang installed --no-deps")
    ap.add_argument("--levels", default="1,4,16,64")
    ap.add_argument("--requests-per-slot", type=int, default=4, help="requests = this x concurrency (min 16)")
    ap.add_argument("--time-scale", type=float, default=2.0)
    ap.add_argument("--input-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", help="write the JSON results here")
    a = ap.parse_args()
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    sg_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    sg_env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    levels = [int(x) for x in a.levels.split(",")]
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        tok = tmp / "tokenizer"
        write_tokenizer(tok)
        server = Server(["--mode", "speculative", "--time-scale", str(a.time_scale)])
        try:
            for r in range(a.rounds):
                for c in levels:
                    n = max(16, a.requests_per_slot * c)
                    for client in (("gpuslate", "sglang") if r % 2 == 0 else ("sglang", "gpuslate")):
                        out = tmp / f"sg-{r}-{c}.jsonl"
                        if client == "gpuslate":
                            _, cpu, stdout = run_client(gpuslate_cmd(server.url, n, c, a), env)
                            lv = json.loads(stdout)["levels"][0]
                            assert lv["failed"] == 0, lv["errors"]
                            fig = {"itl_mean_ms": lv["itl_ms"]["mean"], "itl_median_ms": lv["itl_ms"]["p50"],
                                   "chunk_gap_mean_ms": lv["chunk_gap_ms"]["mean"], "tpot_mean_ms": lv["tpot_ms"]["mean"],
                                   "output_token_throughput": lv["output_token_throughput"]}
                        else:
                            _, cpu, _ = run_client(sglang_cmd(server.url, n, c, a, tok, out), sg_env)
                            doc = json.loads(out.read_text().strip().splitlines()[-1])
                            fig = {"itl_mean_ms": doc["mean_itl_ms"], "itl_median_ms": doc["median_itl_ms"],
                                   "tpot_mean_ms": doc["mean_tpot_ms"],
                                   "output_token_throughput": doc["output_throughput"]}
                        run = {"round": r, "concurrency": c, "client": client, "requests": n, **fig}
                        runs.append(run)
                        print(json.dumps(run), flush=True)
        finally:
            server.stop()
    table = []
    for c in levels:
        ratios = []
        for r in range(a.rounds):
            g = next(x for x in runs if x["round"] == r and x["concurrency"] == c and x["client"] == "gpuslate")
            s = next(x for x in runs if x["round"] == r and x["concurrency"] == c and x["client"] == "sglang")
            ratios.append(g["itl_mean_ms"] / s["itl_mean_ms"])
        g_all = [x for x in runs if x["concurrency"] == c and x["client"] == "gpuslate"]
        s_all = [x for x in runs if x["concurrency"] == c and x["client"] == "sglang"]
        table.append({
            "concurrency": c,
            "gpuslate_itl_mean_ms": round(statistics.median(x["itl_mean_ms"] for x in g_all), 3),
            "sglang_itl_mean_ms": round(statistics.median(x["itl_mean_ms"] for x in s_all), 3),
            "gpuslate_chunk_gap_mean_ms": round(statistics.median(x["chunk_gap_mean_ms"] for x in g_all), 3),
            "ratio_median": round(statistics.median(ratios), 4), "ratios": [round(x, 4) for x in ratios],
            "within_2pct": abs(statistics.median(ratios) - 1) <= 0.02,
        })
    meta = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": platform.node(),
            "cpus": os.cpu_count(), "load_avg": os.getloadavg(), "python": platform.python_version(),
            "command": " ".join(sys.argv), "time_scale": a.time_scale, "input_len": a.input_len,
            "output_len": a.output_len, "rounds": a.rounds}
    doc = {"meta": meta, "table": table, "runs": runs}
    print(json.dumps({"table": table}, indent=2))
    if a.out:
        Path(a.out).write_text(json.dumps(doc, indent=2) + "\n")
    return 0 if all(t["within_2pct"] for t in table) else 1


if __name__ == "__main__":
    sys.exit(main())
