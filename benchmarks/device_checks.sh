#!/usr/bin/env bash
# The GPU checks of a change in one device call: the gpu-marked tests (MPS, renamed workers, a
# holder whose main thread exited, ...), then `run_device.sh fast` (status and clear against the
# Python+NVML floor and nvitop/gpustat). Every MPS daemon the tests start has its own pipe folder
# and is quit by its fixture; anything MPS left at the end is reported and quit here too.
#
#   bash benchmarks/device_checks.sh OUT [TESTS_LIMIT_S]
#
# BEFORE=DIR (a checkout of the code before a change, e.g. `git archive OLD | tar -x -C DIR`, carried):
# `run_device.sh fast` runs in DIR first, then here, on the same machine, and before-after.md puts the
# ratios side by side (benchmarks/compare_runs.py). AB_ROUNDS=N (default 1): N-1 more rounds of
# bench_status alone, before then after, so that status's figures are medians over N turns.
# SKIP_GPU_TESTS=1: only the measurements.
set -u
OUT=${1:?usage: device_checks.sh OUT [TESTS_LIMIT_S]}
W=/tmp/device-checks  # everything goes here; OUT gets the logs, the tables and one archive (<= 8 files)
rm -rf "$W" && mkdir -p "$W" "$OUT"
export PYTHONUNBUFFERED=1
ls .whl/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --target /tmp/site-checks .whl/*.whl \
  >/dev/null 2>&1 && export PYTHONPATH=/tmp/site-checks
echo "== $(date -u '+%F %T') UTC $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
echo "== setproctitle: $(python3 -c 'import setproctitle; print(setproctitle.__version__)' 2>&1 | tail -1)"
SECONDS=0
[ -n "${SKIP_GPU_TESTS:-}" ] && echo "== gpu tests skipped (SKIP_GPU_TESTS)" > "$W/pytest-gpu.log" || \
PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} timeout --kill-after=15 "${2:-300}" \
  python3 -m pytest -m gpu tests/gpu -p no:cacheprovider -q -rA -s 2>&1 | tee "$W/pytest-gpu.log" | tail -60
echo "== gpu tests done in ${SECONDS}s"
if pgrep -f nvidia-cuda-mps >/dev/null; then
  echo "== MPS processes left by the tests (a failure): $(pgrep -af nvidia-cuda-mps | tr '\n' ';')"
  for d in /tmp/pytest-of-*/pytest-*/*/pipe; do [ -d "$d" ] && echo quit | CUDA_MPS_PIPE_DIRECTORY=$d timeout 20 nvidia-cuda-mps-control; done
fi
if [ -n "${BEFORE:-}" ] && [ -d "$BEFORE/benchmarks" ]; then
  [ -e "$BEFORE/.whl" ] || ln -s "$PWD/.whl" "$BEFORE/.whl"
  (cd "$BEFORE" && STATUS_ROUNDS=${STATUS_ROUNDS:-5} CLEAR_REPS=${CLEAR_REPS:-2} \
    bash benchmarks/run_device.sh "$W/fast-before" fast 300) > "$W/run_device-before.txt" 2>&1
  echo "== before ($BEFORE) done at ${SECONDS}s"
fi
STATUS_ROUNDS=${STATUS_ROUNDS:-5} CLEAR_REPS=${CLEAR_REPS:-2} bash benchmarks/run_device.sh "$W/fast" fast 300 \
  > "$W/run_device.txt" 2>&1
BEFORE_RUNS="$W/fast-before" AFTER_RUNS="$W/fast"
if [ -d "$W/fast-before" ]; then
  for r in $(seq 2 "${AB_ROUNDS:-1}"); do
    (cd "$BEFORE" && STATUS_ROUNDS=${STATUS_ROUNDS:-5} bash benchmarks/run_device.sh "$W/status-before-$r" status 200) \
      >> "$W/run_device-before.txt" 2>&1
    STATUS_ROUNDS=${STATUS_ROUNDS:-5} bash benchmarks/run_device.sh "$W/status-after-$r" status 200 >> "$W/run_device.txt" 2>&1
    BEFORE_RUNS="$BEFORE_RUNS,$W/status-before-$r" AFTER_RUNS="$AFTER_RUNS,$W/status-after-$r"
    echo "== round $r done at ${SECONDS}s"
  done
  python3 benchmarks/compare_runs.py "$BEFORE_RUNS" "$AFTER_RUNS" --out "$W/before-after.md"
fi
tail -5 "$W/run_device.txt"
grep -h -A14 "^|" "$W"/fast/*status*.md 2>/dev/null | head -30
tar czf "$OUT/device-checks.tgz" -C "$W" .
cp "$W/pytest-gpu.log" "$W/run_device.txt" "$OUT"/
[ -f "$W/before-after.md" ] && cp "$W/before-after.md" "$OUT"/
for f in "$W"/fast/*.md; do [ -f "$f" ] && cp "$f" "$OUT"/; done
ls -la "$OUT"
