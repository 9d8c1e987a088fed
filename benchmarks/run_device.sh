#!/usr/bin/env bash
# Issue 9's measurements on a GPU machine in one call: status, clear, the profile, swap downtime.
#
#   bash benchmarks/run_device.sh OUT [all|fast|swap] [LIMIT_S]
#
#   all   bench_status, bench_clear, profile_clear, then bench_swap_downtime with the time left
#   fast  the first three (for the 2-GPU machine)
#   status | clear  bench_status alone | bench_clear and profile_clear
#   swap  bench_swap_downtime only
#
# Knobs (environment): STATUS_ROUNDS (10), CLEAR_REPS (3), SWAP_SIZE_GB (22); LIMIT_S bounds the
# whole call (default 570 s): bench_swap_downtime gets what the others left.
#
# Installs, without network: the carried wheels (.whl/: nvitop, gpustat and their
# dependencies) into /tmp/site, and gpuslate itself into /tmp/gs as users get it
# (pip, console script, bytecode compiled). Everything it writes goes to OUT, with a
# log; each step has its own time limit so that one stuck step cannot eat the call.
# The seed line (fuser -k /dev/nvidia*) runs only against this script's own holders.
set -u
OUT=${1:?usage: run_device.sh OUT [all|fast|swap] [LIMIT_S]}
WHAT=${2:-all}
LIMIT=${3:-570}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/run_device.log") 2>&1
export PYTHONUNBUFFERED=1
echo "== $(date -u '+%F %T') UTC $(hostname): $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | sort | uniq -c | tr -s ' ')"
echo "== python $(python3 -V 2>&1), PYTHONDONTWRITEBYTECODE=${PYTHONDONTWRITEBYTECODE:-}, fuser: $(command -v fuser || echo missing)"
ls .whl/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl \
  || echo "== wheels not installed: nvitop/gpustat will be reported unavailable"
rm -rf /tmp/gs
if python3 -m pip install -q --no-deps --no-build-isolation --target /tmp/gs . 2>/dev/null \
   || python3 -m pip install -q --no-deps --target /tmp/gs . 2>/dev/null; then
  echo "== gpuslate installed with pip into /tmp/gs"
else  # no build backend offline: the same layout by hand (package + pip's console-script wrapper)
  rm -rf /tmp/gs && mkdir -p /tmp/gs/bin && cp -r src/gpuslate /tmp/gs/
  printf '#!%s\n# -*- coding: utf-8 -*-\nimport re\nimport sys\nfrom gpuslate.cli import run\nif __name__ == "__main__":\n    sys.argv[0] = re.sub(r"(-script\\.pyw|\\.exe)?$", "", sys.argv[0])\n    sys.exit(run())\n' \
    "$(python3 -c 'import sys; print(sys.executable)')" > /tmp/gs/bin/gpuslate
  chmod +x /tmp/gs/bin/gpuslate
  echo "== pip could not build gpuslate offline: installed by hand into /tmp/gs (package + console script)"
fi
python3 -m compileall -q /tmp/gs /tmp/site >/dev/null 2>&1
# The same gpuslate in a venv of its own, as `pipx install gpuslate` makes one: its Python starts
# without the image's site-packages and their start-up hooks (.pth files). pynvml is copied in too,
# for the Python floor measured in that venv.
rm -rf /tmp/gsv
if python3 -m venv --without-pip /tmp/gsv 2>/dev/null; then
  SP=$(/tmp/gsv/bin/python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  cp -r /tmp/gs/gpuslate /tmp/gs/gpuslate-*.dist-info "$SP"/ 2>/dev/null || cp -r /tmp/gs/gpuslate "$SP"/
  cp "$(python3 -c 'import pynvml; print(pynvml.__file__)')" "$SP"/
  sed "1s|.*|#!/tmp/gsv/bin/python3|" /tmp/gs/bin/gpuslate > /tmp/gsv/bin/gpuslate && chmod +x /tmp/gsv/bin/gpuslate
  /tmp/gsv/bin/python3 -m compileall -q "$SP" >/dev/null 2>&1
  ISOLATED=(--isolated-script /tmp/gsv/bin/gpuslate)
  echo "== isolated venv: /tmp/gsv ($(env -u PYTHONPATH /tmp/gsv/bin/gpuslate --version 2>&1))"
  env -u PYTHONPATH /tmp/gsv/bin/python3 -X importtime /tmp/gsv/bin/gpuslate status --json \
    2> "$OUT/importtime-own-venv-status.txt" >/dev/null
else
  ISOLATED=()
  echo "== no isolated venv (python3 -m venv failed)"
fi
export PYTHONPATH=/tmp/site:/tmp/gs
SCRIPT=(--script /tmp/gs/bin/gpuslate)
echo "== gpuslate: ${SCRIPT[*]:-python3 -m gpuslate} ($(python3 -c 'import gpuslate, os; print(os.path.dirname(gpuslate.__file__))'))"

step() {  # step SECONDS CMD...: run with a limit; never stop the whole script
  local t=$1; shift
  echo "== $(date -u +%T) [${SECONDS}s] $*"
  timeout --kill-after=10 "$t" "$@"
  local rc=$?
  [ $rc -ne 0 ] && echo "== exit $rc: $*"
  return 0
}

case $WHAT in all|fast|status)
  step 180 python3 benchmarks/bench_status.py --out "$OUT" --rounds "${STATUS_ROUNDS:-10}" --hold-gib 8 "${SCRIPT[@]}" "${ISOLATED[@]}";;
esac
case $WHAT in all|fast|clear)
  step 300 python3 benchmarks/bench_clear.py --out "$OUT" --reps "${CLEAR_REPS:-3}" --i-own-this-machine "${SCRIPT[@]}" "${ISOLATED[@]}"
  step 90 python3 benchmarks/profile_clear.py --out "$OUT" --runs 3 --status;;
esac
if [ "$WHAT" = all ] || [ "$WHAT" = swap ]; then
  left=$((LIMIT - SECONDS - 20))
  if [ $left -gt 120 ]; then
    step $((left + 15)) python3 benchmarks/bench_swap_downtime.py --out "$OUT" --runs 2 --size-gb "${SWAP_SIZE_GB:-22}" --budget-s $((left - 40)) "${SCRIPT[@]}"
  else
    echo "== no time left for bench_swap_downtime (${left}s)"
  fi
fi
echo "== done in ${SECONDS}s; results in $OUT:"
ls -la "$OUT"
