#!/usr/bin/env bash
# Issue 17 on a GPU, in one call of under 6 minutes (the lead runs it on one H200):
#
#   1. `gpuslate bench` against a real `transformers serve --continuous-batching` serving a generated
#      (random-weight, Llama-shaped) model with a word-level tokenizer, with --api-key, --tokenizer and
#      --goodput, warm-up at each level: a complete level is the result;
#   2. `gpuslate experiment run` of two real deployments (continuous batching on / off), swapped on
#      the GPU as units, to a report with plots.
#
#   bash benchmarks/device_ab.sh [OUT]        (default: $OUT)
#
# Nothing is downloaded. `transformers serve` needs transformers' [serving] extra (fastapi, starlette,
# uvicorn, pydantic, openai and theirs), which the device image lacks: carry them as wheels in .whl/
# (fastapi 0.115 with starlette 0.46: newer fastapi needs opentelemetry); they go to a fresh
# /tmp/site-ab each run. If `transformers serve` cannot be started with any of the command forms
# tried (its CLI changes between versions), benchmarks/gpu_openai_server.py (a real model on the GPU,
# OpenAI API, enforcing --api-key) takes its place and the log says so. Everything goes to a work
# folder; OUT gets at most 6 files: device_ab.tgz (all of it), the log, bench.json, report.md,
# summary.json and the throughput plot.
set -u
OUT=${1:-${OUT:?usage: device_ab.sh OUT}}
W=/tmp/ab-device
rm -rf "$W" && mkdir -p "$W" "$OUT"
exec > >(tee -a "$W/device_ab.log") 2>&1
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# transformers serve lists the hub cache on /v1/models and fails when it does not exist
export HF_HUB_CACHE="$W/hf-cache" && mkdir -p "$HF_HUB_CACHE"
BUDGET=${AB_BUDGET:-330}  # seconds for the whole script; the experiment is skipped when under 60 are left
PY=${PYTHON:-python3}
KEY=sk-gpuslate-ab-test
PORT=8101
echo "== $(date -u '+%F %T') UTC $(hostname): $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)"
echo "== $($PY -c 'import sys, torch, transformers, tokenizers, aiohttp; print(sys.version.split()[0], "torch", torch.__version__, "transformers", transformers.__version__, "tokenizers", tokenizers.__version__, "aiohttp", aiohttp.__version__)' 2>&1)"
echo "== $($PY -c 'import rich, matplotlib, setproctitle; print("rich, matplotlib", matplotlib.__version__, "and setproctitle present")' 2>&1 | tail -1)"

# gpuslate as users get it, without network (the package itself; its deps are in the image or carried)
rm -rf /tmp/gs && mkdir -p /tmp/gs && cp -r src/gpuslate /tmp/gs/
rm -rf /tmp/site-ab && ls .whl/*.whl >/dev/null 2>&1 && $PY -m pip install -q --no-index --no-deps --upgrade --target /tmp/site-ab .whl/*.whl
export PYTHONPATH=/tmp/gs:/tmp/site-ab
GS=("$PY" -m gpuslate)
"${GS[@]}" --version

step() {  # step SECONDS CMD...: a limit per step; never stops the script
  local t=$1; shift
  echo "== $(date -u +%T) [${SECONDS}s] $*"
  timeout --kill-after=10 "$t" "$@"
  local rc=$?
  [ $rc -ne 0 ] && echo "== exit $rc: $*"
  return $rc
}

# -- a generated model: random weights, a word-level tokenizer whose words are one token each -------
step 120 "$PY" benchmarks/gen_model.py "$W/model"
MODEL="$W/model"
[ -f "$MODEL/tokenizer.json" ] || { echo "== no model was generated; stopping"; tar czf "$OUT/device_ab.tgz" -C "$W" .; cp "$W/device_ab.log" "$OUT/"; exit 1; }

TS=()
if command -v transformers >/dev/null 2>&1; then TS=(transformers serve)
else TS=("$PY" -c "import sys; from transformers.cli.transformers import main; sys.argv[0] = 'transformers'; main()" serve); fi

up() {  # up LOG CMD...: start a server in the background, wait for /v1/models; 0 when it answers
  local log=$1; shift
  "$@" >"$log" 2>&1 &
  SERVER=$!
  for _ in $(seq 60); do
    kill -0 $SERVER 2>/dev/null || { echo "== exited: $*"; tail -5 "$log"; return 1; }
    "$PY" - "$PORT" <<'PYEOF' 2>/dev/null && return 0
import sys, urllib.request
req = urllib.request.Request(f"http://127.0.0.1:{sys.argv[1]}/v1/models", headers={"Authorization": "Bearer sk-gpuslate-ab-test"})
urllib.request.urlopen(req, timeout=2)
PYEOF
    sleep 1
  done
  echo "== not answering after 60 s: $*"; tail -5 "$log"; stop; return 1
}
stop() {
  [ -n "${SERVER:-}" ] || return 0
  kill -TERM $SERVER 2>/dev/null; for _ in $(seq 100); do kill -0 $SERVER 2>/dev/null || break; sleep 0.1; done
  kill -KILL $SERVER 2>/dev/null; wait $SERVER 2>/dev/null; SERVER=
}
trap stop EXIT

# -- 1. bench against the real server ------------------------------------------------------------
ENGINE=transformers
SERVE_CB=("${TS[@]}" --continuous-batching --port $PORT --host 127.0.0.1 --force-model "$MODEL")
if ! up "$W/server-transformers.log" "${SERVE_CB[@]}"; then
  SERVE_CB=("${TS[@]}" "$MODEL" --continuous-batching --port $PORT --host 127.0.0.1)
  FORM=positional  # transformers >= 5: the model is an argument, --force-model is gone
  if ! up "$W/server-transformers-2.log" "${SERVE_CB[@]}"; then
    ENGINE=gpu_openai_server
    SERVE_CB=("$PY" benchmarks/gpu_openai_server.py --port $PORT --size small --max-batch 64 --api-key $KEY
              --model-name "$MODEL")
    echo "== transformers serve did not start: using benchmarks/gpu_openai_server.py instead"
    up "$W/server-gpu_openai_server.log" "${SERVE_CB[@]}" || { echo "== no server"; }
  fi
fi
echo "== server: $ENGINE: ${SERVE_CB[*]}"
BENCH=("${GS[@]}" bench "http://127.0.0.1:$PORT" --model "$MODEL" --api-key $KEY --tokenizer "$MODEL"
       --goodput ttft:3000,tpot:300,e2e:60000 -c 1,8 -n 16 --warmup 4 --input-len 32 --output-len 64)
for api in completions chat; do  # transformers serve 5.17 answers chat with 422 to these requests
  for eos in "" --no-ignore-eos; do
    [ $SECONDS -gt 200 ] && { echo "== no time for another bench attempt"; break 2; }
    step 100 "${BENCH[@]}" --api $api $eos --json --out "$W/bench.json" >"$W/bench-stdout.json"
    rc=$?
    echo "== bench --api $api $eos: exit $rc"
    if "$PY" -c "import json,sys; d=json.load(open('$W/bench.json')); sys.exit(0 if d['levels'] and all(l['completed'] > 0 for l in d['levels']) else 1)" 2>/dev/null; then
      "$PY" -c "import json; d=json.load(open('$W/bench.json')); print(json.dumps([{k: l[k] for k in ('concurrency', 'completed', 'failed', 'output_token_throughput', 'token_source', 'goodput', 'slo_attainment', 'warming')} | {'itl_p50': l['itl_ms']['p50'], 'ttft_p50': l['ttft_ms']['p50']} for l in d['levels']], indent=1))"
      API=$api; EOS=$eos; break 2
    fi
  done
done
echo "== without the key (the real server must refuse, or gpuslate says it ignored it):"
"${GS[@]}" bench "http://127.0.0.1:$PORT" --model "$MODEL" -n 1 --output-len 4 --api "${API:-chat}" ${EOS:-} \
  --json >"$W/bench-nokey.json" 2>"$W/bench-nokey.err"; echo "== exit $?: $(head -2 "$W/bench-nokey.err")"
stop

# -- 2. an experiment of two real deployments ------------------------------------------------------
"$PY" - "$W" "$PORT" "$ENGINE" "${API:-chat}" "${EOS:-}" "$MODEL" "$PY" "${FORM:-option}" <<'PYEOF'
import json, sys
w, port, engine, api, eos, model, py, form = sys.argv[1:9]
if engine == "transformers":
    import shutil
    ts = ["transformers", "serve"] if shutil.which("transformers") else [
        py, "-c", "import sys; from transformers.cli.transformers import main; sys.argv[0] = 'transformers'; main()", "serve"]
    where = [model] if form == "positional" else []
    forced = [] if form == "positional" else ["--force-model", model]
    a = ts + where + ["--continuous-batching", "--port", port, "--host", "127.0.0.1"] + forced
    b = ts + where + ["--port", port, "--host", "127.0.0.1"] + forced
else:
    import os
    base = [py, os.path.abspath("benchmarks/gpu_openai_server.py"), "--port", port, "--size", "small", "--model-name", model,
            "--api-key", "sk-gpuslate-ab-test"]
    a, b = base + ["--max-batch", "64"], base + ["--max-batch", "1"]
ready = "/v1/models" if engine == "transformers" else "/health"


def unit(name, cmd):
    return (f"[units.{name}]\ncommand = {json.dumps(cmd)}\ngpus = \"0\"\nport = {port}\nready_url = \"{ready}\"\n"
            "start_timeout = 150\ngrace = 10\nstop_timeout = 30\n\n")


load = {"concurrency": [1, 4, 16], "requests": 16, "repeats": 2, "warmup": 4, "input_len": 32,
        "output_len": 32, "api": api, "seed": 0, "model": model, "tokenizer": model,
        "api_key_env": "OPENAI_API_KEY"}
if eos:
    load["ignore_eos"] = False
text = ("[experiment]\nname = \"h200-ab\"\norder = \"interleaved\"\n\n[load]\n"
        + "".join(f"{k} = {json.dumps(v)}\n" for k, v in load.items()) + "\n"
        + unit("batched", a) + unit("one-at-a-time", b))
open(f"{w}/ab.toml", "w").write(text)
print(text)
PYEOF
left=$((BUDGET - SECONDS))
echo "== ${left}s left for the experiment"
if [ $left -gt 60 ]; then
  GPUSLATE_STATE_DIR="$W/state" OPENAI_API_KEY=$KEY step $left "${GS[@]}" experiment run "$W/ab.toml" --out "$W/exp" --json >"$W/experiment.json"
  echo "== experiment: exit $?"
  [ -f "$W/exp/experiment.json" ] && "${GS[@]}" experiment report "$W/exp" | tail -30
fi
nvidia-smi --query-compute-apps=pid,used_memory --format=csv 2>/dev/null

tar czf "$OUT/device_ab.tgz" -C "$W" --exclude=model --exclude=state .
cp "$W/device_ab.log" "$OUT/"
cp "$W/bench.json" "$OUT/" 2>/dev/null
cp "$W/exp/report.md" "$W/exp/summary.json" "$W/exp/throughput_vs_concurrency.png" "$OUT/" 2>/dev/null
echo "== done in ${SECONDS}s"; ls -la "$OUT"
