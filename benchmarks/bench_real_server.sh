#!/usr/bin/env bash
# gpuslate bench and SGLang's bench_serving side by side against a real GPU server.
#
# Starts benchmarks/gpu_openai_server.py (a random-weight Llama on the GPU, OpenAI API,
# streaming, usage), waits until it answers, then for each concurrency level runs
# `gpuslate bench` and SGLang's client (benchmarks/sglang_bench_serving.py, unmodified
# sglang.benchmark.serving) one after the other on the same prompts' shape, writes
# every result and a summary.json to the output folder, and stops the server.
#
#   benchmarks/bench_real_server.sh [OUTDIR]        (default: $OUT, else benchmarks/results/real-server)
#
# Environment: PYTHON (python3), SIZE (1b), LEVELS ("1 8 32 64 128"), REQUESTS_PER_SLOT (4: requests of a
# level = max(16, 4 * c)), INPUT_LEN (128), OUTPUT_LEN (128), PORT (8000), DEVICE (cuda),
# SGLANG=0 to skip the SGLang client (it needs sglang --no-deps, msgspec, orjson, pyzmq, pybase64).
set -euo pipefail

cd "$(dirname "$0")/.."
OUT_DIR=${1:-${OUT:-benchmarks/results/real-server}}
PY=${PYTHON:-python3}
SIZE=${SIZE:-1b}
LEVELS=${LEVELS:-1 8 32 64 128}
PER_SLOT=${REQUESTS_PER_SLOT:-4}
IN=${INPUT_LEN:-128}
OUT_LEN=${OUTPUT_LEN:-128}
PORT=${PORT:-8000}
DEVICE=${DEVICE:-cuda}
SGLANG=${SGLANG:-1}
URL="http://127.0.0.1:$PORT"
mkdir -p "$OUT_DIR"

"$PY" benchmarks/gpu_openai_server.py --port "$PORT" --size "$SIZE" --device "$DEVICE" \
    >"$OUT_DIR/server.log" 2>&1 &
SERVER=$!
stop_server() {
    if kill -0 "$SERVER" 2>/dev/null; then
        kill -TERM "$SERVER" 2>/dev/null || true
        for _ in $(seq 100); do kill -0 "$SERVER" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$SERVER" 2>/dev/null || true
    fi
    wait "$SERVER" 2>/dev/null || true
}
trap stop_server EXIT

for i in $(seq 600); do
    if "$PY" -c "import urllib.request,sys; urllib.request.urlopen('$URL/health', timeout=2)" 2>/dev/null; then
        break
    fi
    kill -0 "$SERVER" 2>/dev/null || { echo "server exited:"; cat "$OUT_DIR/server.log"; exit 6; }
    sleep 1
done
cat "$OUT_DIR/server.log"

TOK="$OUT_DIR/tokenizer"
PYTHONPATH=src "$PY" -c "import sys; sys.path.insert(0, 'benchmarks'); from pathlib import Path; \
import bench_loadgen as b; b.write_tokenizer(Path('$TOK'))"

# one untimed wave at every level first, so that the kernels, allocator pools and caches for
# every batch size exist before either client is timed
for c in $LEVELS; do
    PYTHONPATH=src "$PY" -m gpuslate bench "$URL" -c "$c" -n "$c" --input-len "$IN" \
        --output-len "$OUT_LEN" >/dev/null
done

run_gpuslate() {  # c n
    "$PY" benchmarks/cpu_time.py "$OUT_DIR/gpuslate-c$1.cpu" \
        env PYTHONPATH=src "$PY" -m gpuslate bench "$URL" -c "$1" -n "$2" --input-len "$IN" \
        --output-len "$OUT_LEN" --json --out "$OUT_DIR/gpuslate-c$1.json" >/dev/null
}
run_sglang() {  # c n
    [ "$SGLANG" = 1 ] || return 0
    "$PY" benchmarks/cpu_time.py "$OUT_DIR/sglang-c$1.cpu" \
        env HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 "$PY" benchmarks/sglang_bench_serving.py \
        --backend sglang-oai --base-url "$URL" --model "random-llama-$SIZE" --tokenizer "$TOK" \
        --dataset-name random-ids --random-input-len "$IN" --random-output-len "$OUT_LEN" \
        --random-range-ratio 1.0 --num-prompts "$2" --max-concurrency "$1" --request-rate inf \
        --disable-tqdm --seed 1 --ready-check-timeout-sec 0 --warmup-requests 1 \
        --output-file "$OUT_DIR/sglang-c$1.jsonl" >"$OUT_DIR/sglang-c$1.log" 2>&1 \
        || { echo "sglang client failed at c=$1:"; tail -20 "$OUT_DIR/sglang-c$1.log"; }
}

i=0
for c in $LEVELS; do
    n=$(( c * PER_SLOT > 16 ? c * PER_SLOT : 16 ))
    echo "== c=$c n=$n"
    # alternate which client goes first, so that neither always meets a warmer server
    if [ $((i % 2)) = 0 ]; then run_gpuslate "$c" "$n"; run_sglang "$c" "$n"
    else run_sglang "$c" "$n"; run_gpuslate "$c" "$n"; fi
    i=$((i + 1))
done

OUT_DIR="$OUT_DIR" LEVELS="$LEVELS" "$PY" - <<'EOF'
import json, os
from pathlib import Path

out = Path(os.environ["OUT_DIR"])
rows = []
for c in os.environ["LEVELS"].split():
    g = json.loads((out / f"gpuslate-c{c}.json").read_text())
    lv = g["levels"][0]
    row = {"concurrency": int(c), "gpuslate": {
        "completed": lv["completed"], "failed": lv["failed"], "output_token_throughput": lv["output_token_throughput"],
        "request_throughput": lv["request_throughput"], "ttft_ms_mean": lv["ttft_ms"]["mean"],
        "tpot_ms_mean": lv["tpot_ms"]["mean"], "itl_ms_mean": lv["itl_ms"]["mean"], "e2e_ms_mean": lv["e2e_ms"]["mean"],
        "client_cpu_s": sum(map(float, (out / f"gpuslate-c{c}.cpu").read_text().split()[-2:]))}}
    sg = out / f"sglang-c{c}.jsonl"
    if sg.exists() and sg.read_text().strip():
        s = json.loads(sg.read_text().strip().splitlines()[-1])
        row["sglang"] = {
            "completed": s["completed"], "output_token_throughput": s["output_throughput"],
            "request_throughput": s["request_throughput"], "ttft_ms_mean": s["mean_ttft_ms"],
            "tpot_ms_mean": s["mean_tpot_ms"], "itl_ms_mean": s["mean_itl_ms"], "e2e_ms_mean": s["mean_e2e_latency_ms"],
            "client_cpu_s": sum(map(float, (out / f"sglang-c{c}.cpu").read_text().split()[-2:]))}
        row["ratio_output_token_throughput"] = round(
            row["gpuslate"]["output_token_throughput"] / row["sglang"]["output_token_throughput"], 4)
    rows.append(row)
(out / "summary.json").write_text(json.dumps({"levels": rows}, indent=2) + "\n")
print(f"{'c':>5} {'gpuslate tok/s':>15} {'sglang tok/s':>13} {'ratio':>6} {'g TTFT':>8} {'s TTFT':>8} {'g TPOT':>7} {'s TPOT':>7}")
for r in rows:
    g, s = r["gpuslate"], r.get("sglang", {})
    print(f"{r['concurrency']:>5} {g['output_token_throughput']:>15.1f} {s.get('output_token_throughput', float('nan')):>13.1f} "
          f"{r.get('ratio_output_token_throughput', float('nan')):>6.3f} {g['ttft_ms_mean']:>8.1f} "
          f"{s.get('ttft_ms_mean', float('nan')):>8.1f} {g['tpot_ms_mean']:>7.2f} {s.get('tpot_ms_mean', float('nan')):>7.2f}")
EOF
