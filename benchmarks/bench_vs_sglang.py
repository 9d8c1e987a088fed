"""`gpuslate bench` against SGLang's `bench_serving`, side by side on one simulated server (issue 38).

Two phases, each against `gpuslate sim serve`, every client a separate process, the clients' order
rotated every round (interleaved: drift on this shared machine falls on all of them alike):

1. **Figures.** For each mode (baseline, speculative) one server; at each concurrency level, once per
   round: `gpuslate bench` with ``--connection per-request`` (the engines' convention: SGLang's client
   opens an ``aiohttp.ClientSession`` for every request, its clock started before connecting),
   `gpuslate bench` as it runs by default (``pooled``: keep-alive connections, vLLM's convention), and
   SGLang's client (``--backend sglang-oai``, the same streamed ``/v1/completions``, ``--dataset-name
   random-ids`` over a generated word-level tokenizer whose words are one simulator token each, one
   warm-up request; gpuslate gets ``--warmup 1`` likewise). Each metric's ratio gpuslate / SGLang is
   taken per round and the median over rounds reported: output and request throughput, and the mean
   and median of TTFT, ITL, TPOT and E2E. SGLang's ITL is per token where the server reports an accept
   length (the speculative mode: it re-tokenizes each chunk), compared with gpuslate's ``itl_ms``;
   else (the baseline mode) the gap between text chunks, compared with gpuslate's ``chunk_gap_ms``
   (they differ where a busy server puts two tokens in one chunk).
2. **CPU per request.** Baseline server, concurrency 64: each client's user+sys CPU seconds (``wait4``)
   for a short run and a long one in the same round; the marginal CPU per request is their
   difference over the difference in requests (interpreter start-up, imports and the warm-up cancel).
   Clients: `gpuslate bench` as installed (with the ``fast`` extra where it is there: uvloop, orjson
   and httptools), the same with those hidden (the path without the extra), and SGLang's client.

SGLang's client runs unmodified through ``benchmarks/sglang_bench_serving.py`` in a virtual environment
with ``sglang`` installed without its GPU dependencies; ``--make-sglang-venv DIR`` makes one
(``pip install --no-deps sglang==VERSION`` plus what its client imports), else give ``--sglang-python``.

    python benchmarks/bench_vs_sglang.py --make-sglang-venv /tmp/sglbench/venv \\
        --out benchmarks/results/cpu-vs-sglang.json

Exit status 0 when every criterion of issue 38 holds: throughput, ITL, TPOT and E2E within 2% and TTFT
within 3% (per-request connections) at every level and mode, and gpuslate's marginal CPU per request at
most half of SGLang's (the medians over rounds).
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
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_loadgen import ROOT, SRC, Server, run_client, write_tokenizer

#: what SGLang's client imports besides sglang itself (installed with --no-deps: no torch, no CUDA)
SGLANG_CLIENT_DEPS = ("aiohttp", "numpy", "requests", "tqdm", "transformers", "tokenizers", "msgspec", "orjson",
                      "pyzmq", "psutil", "pybase64", "pillow")
#: gpuslate without the fast extra: its packages blocked as if not installed (as tests/test_extras.py does)
PURE = ("import sys\nfor name in ('uvloop', 'orjson', 'httptools'):\n    sys.modules[name] = None\n"
        "from gpuslate.cli import run\nsys.argv[0] = 'gpuslate'\nrun()\n")
#: (name in the table, gpuslate's level key, SGLang's key); summaries are {mean, p50} in gpuslate's JSON
FIGURES = (("output_throughput", "output_token_throughput", "output_throughput"),
           ("request_throughput", "request_throughput", "request_throughput"),
           ("ttft_mean", ("ttft_ms", "mean"), "mean_ttft_ms"), ("ttft_median", ("ttft_ms", "p50"), "median_ttft_ms"),
           ("itl_mean", ("itl_ms", "mean"), "mean_itl_ms"), ("itl_median", ("itl_ms", "p50"), "median_itl_ms"),
           ("tpot_mean", ("tpot_ms", "mean"), "mean_tpot_ms"), ("tpot_median", ("tpot_ms", "p50"), "median_tpot_ms"),
           ("e2e_mean", ("e2e_ms", "mean"), "mean_e2e_latency_ms"),
           ("e2e_median", ("e2e_ms", "p50"), "median_e2e_latency_ms"))
#: the bound of each figure's ratio in the done-when of issue 38 (TTFT: in the engines' convention)
BOUNDS = {"ttft": 0.03}
DEFAULT_BOUND = 0.02


def make_sglang_venv(folder: Path, version: str) -> str:
    """A virtual environment with SGLang's client and none of its GPU dependencies; its python."""
    py = folder / "bin" / "python"
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", f"sglang=={version}"], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", *SGLANG_CLIENT_DEPS], check=True)
    return str(py)


def gpuslate_cmd(client: str, url: str, n: int, c: int, a: argparse.Namespace) -> list[str]:
    head = [sys.executable, "-c", PURE] if client == "gpuslate-pure" else [sys.executable, "-m", "gpuslate"]
    connection = "per-request" if client == "gpuslate-per-request" else "pooled"
    return [*head, "bench", url, "-c", str(c), "-n", str(n), "--warmup", "1", "--warmup-first-only",
            "--input-len", str(a.input_len), "--output-len", str(a.output_len), "--connection", connection, "--json"]


def sglang_cmd(py: str, url: str, n: int, c: int, a: argparse.Namespace, tok: Path, out: Path) -> list[str]:
    return [py, str(ROOT / "benchmarks" / "sglang_bench_serving.py"), "--backend", "sglang-oai",
            "--base-url", url, "--model", "sim-model", "--tokenizer", str(tok),
            "--dataset-name", "random-ids", "--random-input-len", str(a.input_len), "--random-output-len",
            str(a.output_len), "--random-range-ratio", "1.0", "--num-prompts", str(n), "--max-concurrency", str(c),
            "--request-rate", "inf", "--disable-tqdm", "--seed", "1", "--ready-check-timeout-sec", "0",
            "--warmup-requests", "1", "--output-file", str(out)]


def figures_gpuslate(stdout: str) -> dict[str, float]:
    lv = json.loads(stdout)["levels"][0]
    if lv["failed"]:
        raise RuntimeError(f"gpuslate: {lv['failed']} request(s) failed: {lv['errors']}")
    out = {}
    for name, key, _ in FIGURES:
        out[name] = lv[key[0]][key[1]] if isinstance(key, tuple) else lv[key]
    # SGLang's ITL is the chunk gap where the server reports no accept length (the baseline mode)
    out["chunk_gap_mean"], out["chunk_gap_median"] = lv["chunk_gap_ms"]["mean"], lv["chunk_gap_ms"]["p50"]
    out["completed"] = lv["completed"]
    return out


def figures_sglang(path: Path) -> dict[str, float]:
    doc = json.loads(path.read_text().strip().splitlines()[-1])
    if doc["completed"] != doc.get("num_prompts", doc["completed"]):
        raise RuntimeError(f"SGLang: {doc['completed']} of {doc['num_prompts']} completed")
    out = {name: doc[key] for name, _, key in FIGURES}
    out["completed"] = doc["completed"]
    path.unlink()  # the next run appends to the same name otherwise
    return out


def run_one(client: str, url: str, n: int, c: int, a: argparse.Namespace, tok: Path,
            tmp: Path) -> tuple[float, dict[str, float]]:
    """(client CPU seconds, figures) of one run."""
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    if client == "sglang":
        sg_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        sg_env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
        out = tmp / "sglang.jsonl"
        _, cpu, _ = run_client(sglang_cmd(a.sglang_python, url, n, c, a, tok, out), sg_env)
        return cpu, figures_sglang(out)
    _, cpu, stdout = run_client(gpuslate_cmd(client, url, n, c, a), env)
    return cpu, figures_gpuslate(stdout)


def rotated(clients: tuple[str, ...], r: int) -> tuple[str, ...]:
    k = r % len(clients)
    return clients[k:] + clients[:k]


def phase_figures(a: argparse.Namespace, tok: Path, tmp: Path) -> list[dict[str, Any]]:
    clients = ("gpuslate-per-request", "sglang", "gpuslate")
    runs = []
    for mode in a.modes.split(","):
        server = Server(["--mode", mode, "--time-scale", str(a.time_scale)])
        try:
            for r in range(a.rounds):
                for c in (int(x) for x in a.levels.split(",")):
                    for client in rotated(clients, r):
                        cpu, fig = run_one(client, server.url, a.requests, c, a, tok, tmp)
                        run = {"phase": "figures", "mode": mode, "round": r, "concurrency": c, "client": client,
                               "client_cpu_s": round(cpu, 3), **fig}
                        runs.append(run)
                        print(json.dumps(run), flush=True)
        finally:
            server.stop()
    return runs


def phase_cpu(a: argparse.Namespace, tok: Path, tmp: Path) -> list[dict[str, Any]]:
    clients = ("gpuslate", "sglang", "gpuslate-pure")
    runs = []
    server = Server(["--time-scale", str(a.cpu_time_scale)])
    try:
        for r in range(a.cpu_rounds):
            for client in rotated(clients, r):
                for n in (a.cpu_short, a.cpu_long):
                    s0 = server.cpu_seconds()
                    cpu, fig = run_one(client, server.url, n, a.cpu_concurrency, a, tok, tmp)
                    run = {"phase": "cpu", "round": r, "client": client, "requests": n,
                           "client_cpu_s": round(cpu, 3), "server_cpu_s": round(server.cpu_seconds() - s0, 3),
                           "output_throughput": fig["output_throughput"], "completed": fig["completed"]}
                    runs.append(run)
                    print(json.dumps(run), flush=True)
    finally:
        server.stop()
    return runs


def _q(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 4), "min": round(min(values), 4),
            "max": round(max(values), 4)}


def summarize_figures(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    table = []
    for mode in dict.fromkeys(x["mode"] for x in runs):
        for c in dict.fromkeys(x["concurrency"] for x in runs if x["mode"] == mode):
            rows = [x for x in runs if x["mode"] == mode and x["concurrency"] == c]
            rounds = sorted({x["round"] for x in rows})

            def of(client: str, r: int, rows: list[dict[str, Any]] = rows) -> dict[str, Any]:
                return next(x for x in rows if x["client"] == client and x["round"] == r)

            entry: dict[str, Any] = {"mode": mode, "concurrency": c, "ratios": {}, "ratios_pooled": {},
                                     "sglang": {}, "gpuslate_per_request": {}, "gpuslate_pooled": {}}
            ok = True
            for name, _, _ in FIGURES:
                # baseline: SGLang's ITL is the chunk gap (no accept length reported), gpuslate's chunk_gap_ms
                mine = name.replace("itl", "chunk_gap") if mode == "baseline" else name
                per = [of("gpuslate-per-request", r)[mine] / of("sglang", r)[name] for r in rounds]
                pooled = [of("gpuslate", r)[mine] / of("sglang", r)[name] for r in rounds]
                entry["ratios"][name] = _q(per)
                entry["ratios_pooled"][name] = _q(pooled)
                for client, key in (("sglang", "sglang"), ("gpuslate-per-request", "gpuslate_per_request"),
                                    ("gpuslate", "gpuslate_pooled")):
                    entry[key][name] = round(statistics.median(
                        of(client, r)[name if client == "sglang" else mine] for r in rounds), 3)
                if "median" in name and name != "ttft_median":
                    continue  # the done-when is on the means (SGLang's and vLLM's headline figures) and TTFT
                bound = BOUNDS.get(name.split("_")[0], DEFAULT_BOUND)
                ok = ok and abs(statistics.median(per) - 1) <= bound
            entry["within_bounds"] = ok
            table.append(entry)
    return table


def summarize_cpu(runs: list[dict[str, Any]], a: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for client in dict.fromkeys(x["client"] for x in runs):
        marginal = []
        for r in sorted({x["round"] for x in runs}):
            mine = {x["requests"]: x for x in runs if x["client"] == client and x["round"] == r}
            marginal.append(1000 * (mine[a.cpu_long]["client_cpu_s"] - mine[a.cpu_short]["client_cpu_s"])
                            / (a.cpu_long - a.cpu_short))
        start = [x["client_cpu_s"] for x in runs if x["client"] == client and x["requests"] == a.cpu_short]
        out[client] = {"marginal_cpu_ms_per_request": _q(marginal),
                       "marginal_runs": [round(m, 3) for m in marginal],
                       "short_run_cpu_s": _q(start)}
    sg = out["sglang"]["marginal_cpu_ms_per_request"]["median"]
    out["ratio_to_sglang"] = {client: round(v["marginal_cpu_ms_per_request"]["median"] / sg, 3)
                              for client, v in out.items() if client != "sglang"}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    venv = ap.add_mutually_exclusive_group(required=True)
    venv.add_argument("--sglang-python", help="python of a venv with sglang installed --no-deps")
    venv.add_argument("--make-sglang-venv", metavar="DIR", help="make (or reuse) that venv in DIR")
    ap.add_argument("--sglang-version", default="0.5.23")
    ap.add_argument("--modes", default="baseline,speculative")
    ap.add_argument("--levels", default="1,4,16,64")
    ap.add_argument("--requests", type=int, default=64, help="requests per level (phase 1)")
    ap.add_argument("--time-scale", type=float, default=1.0, help="of the figures' server (TTFT and ITL: <= 10)")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cpu-concurrency", type=int, default=64)
    ap.add_argument("--cpu-short", type=int, default=64)
    ap.add_argument("--cpu-long", type=int, default=1280)
    ap.add_argument("--cpu-rounds", type=int, default=3)
    ap.add_argument("--cpu-time-scale", type=float, default=4.0,
                    help="of the CPU phase's server (a chunk still arrives alone at concurrency 64)")
    ap.add_argument("--phases", default="figures,cpu")
    ap.add_argument("--out", help="write the JSON results here")
    a = ap.parse_args()
    if a.make_sglang_venv:
        a.sglang_python = make_sglang_venv(Path(a.make_sglang_venv), a.sglang_version)
    phases = a.phases.split(",")
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        tok = tmp / "tokenizer"
        write_tokenizer(tok)
        fig_runs = phase_figures(a, tok, tmp) if "figures" in phases else []
        cpu_runs = phase_cpu(a, tok, tmp) if "cpu" in phases else []
    doc: dict[str, Any] = {"meta": {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t0)), "minutes": round((time.time() - t0) / 60, 1),
        "machine": platform.node(), "cpus": os.cpu_count(), "load_avg_after": os.getloadavg(),
        "python": platform.python_version(), "sglang": a.sglang_version, "command": " ".join(sys.argv),
        **{k: v for k, v in vars(a).items() if k not in ("sglang_python", "make_sglang_venv", "out")}}}
    ok = True
    if fig_runs:
        doc["figures"] = summarize_figures(fig_runs)
        ok = ok and all(t["within_bounds"] for t in doc["figures"])
    if cpu_runs:
        doc["cpu"] = summarize_cpu(cpu_runs, a)
        ok = ok and doc["cpu"]["ratio_to_sglang"]["gpuslate"] <= 0.5
    doc["ok"] = ok
    doc["runs"] = fig_runs + cpu_runs
    print(json.dumps({k: v for k, v in doc.items() if k != "runs"}, indent=1))
    if a.out:
        Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
