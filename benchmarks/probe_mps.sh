#!/usr/bin/env bash
# What NVML, nvidia-smi and /proc show of real processes the simulated host must reproduce
# (issue 24), on a GPU machine, touching only what this script starts:
#   1. a private MPS daemon (its own CUDA_MPS_PIPE_DIRECTORY / CUDA_MPS_LOG_DIRECTORY in a temporary
#      folder, quit at the end, also on failure) with two torch clients, then idle;
#   2. a torch process whose main thread calls pthread_exit while another thread keeps its memory.
#
#   bash benchmarks/probe_mps.sh OUT
set -u
OUT=${1:-${OUT:?usage: probe_mps.sh OUT}}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/probe_mps.log") 2>&1
export PYTHONUNBUFFERED=1
D=$(mktemp -d /tmp/mps-probe.XXXXXX)
export CUDA_MPS_PIPE_DIRECTORY=$D/pipe CUDA_MPS_LOG_DIRECTORY=$D/log
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done
  echo quit | timeout 20 nvidia-cuda-mps-control
  sleep 1
  pgrep -af nvidia-cuda-mps || echo "== no MPS process left"
  rm -rf "$D"
}
trap cleanup EXIT
echo "== $(date -u '+%F %T') UTC: $(nvidia-smi --query-gpu=name,driver_version,compute_mode --format=csv,noheader)"

cat > "$D/client.py" <<'PY'
import sys, time, os, torch
gib = float(sys.argv[1]); stop = sys.argv[2]
x = torch.empty(int(gib * 2**30), dtype=torch.uint8, device="cuda")
y = torch.ones(1 << 20, device="cuda")
print(f"client {os.getpid()} holds {gib} GiB", flush=True)
n = 0
while not os.path.exists(stop):
    y = y * 1.0000001; torch.cuda.synchronize(); n += 1; time.sleep(0.01)
print(f"client {os.getpid()} done, {n} steps, ok {bool(torch.isfinite(y).all())}", flush=True)
PY
cat > "$D/facts.py" <<'PY'
import os, sys, pynvml as N
N.nvmlInit()
print("driver", N.nvmlSystemGetDriverVersion(), "nvml", N.nvmlSystemGetNVMLVersion())
def show(pid):
    p = f"/proc/{pid}"
    try:
        exe = os.readlink(p + "/exe")
    except OSError as e:
        exe = f"? {e}"
    try:
        st = dict(l.split(":", 1) for l in open(p + "/status").read().splitlines() if ":" in l)
        stat = open(p + "/stat").read().rsplit(")", 1)[1].split()
        cmd = open(p + "/cmdline", "rb").read().replace(b"\0", b" ")[:200]
        env = [e for e in open(p + "/environ", "rb").read().split(b"\0") if e.startswith(b"CUDA")]
        fds = []
        for tdir in [p + "/fd"] + [f"{p}/task/{t}/fd" for t in os.listdir(p + "/task")][:3]:
            try:
                fds.append((tdir, sorted({os.readlink(f"{tdir}/{f}") for f in os.listdir(tdir)
                                          if os.readlink(f"{tdir}/{f}").startswith(("/dev/nv", "socket"))})[:12]))
            except OSError as e:
                fds.append((tdir, f"? {e}"))
        print(f"  pid {pid}: exe={exe} state={stat[0]} ppid={stat[1]} pgid={stat[2]} sid={stat[3]} "
              f"uid={st['Uid'].split()[0]} threads={st['Threads'].strip()} cmd={cmd!r}\n    env={env}")
        for t, f in fds:
            print(f"    {t}: {f}")
    except OSError as e:
        print(f"  pid {pid}: exe={exe} ({e})")
for i in range(N.nvmlDeviceGetCount()):
    h = N.nvmlDeviceGetHandleByIndex(i)
    m = N.nvmlDeviceGetMemoryInfo(h)
    print(f"GPU {i}: used {m.used >> 20} MiB of {m.total >> 20}")
    for name in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetMPSComputeRunningProcesses",
                 "nvmlDeviceGetGraphicsRunningProcesses"):
        try:
            ps = getattr(N, name)(h)
        except Exception as e:  # noqa: BLE001 — a probe prints what failed
            print(f" {name}: failed {e!r}"); continue
        print(f" {name}: {[(p.pid, (p.usedGpuMemory or 0) >> 20) for p in ps]}")
        for p in ps:
            show(p.pid)
    try:
        print(" running processes detail:", N.nvmlDeviceGetRunningProcessDetailList)
    except AttributeError:
        pass
for a in sys.argv[1:]:
    print("extra pid"); show(int(a))
PY
facts() { echo "== facts: $1"; timeout 60 python3 "$D/facts.py" "${@:2}"; timeout 30 nvidia-smi | sed -n '/Processes/,$p'
  timeout 30 nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv; }

facts "before the daemon"
nvidia-cuda-mps-control -d && echo "== MPS control daemon started ($D)"
sleep 1; pgrep -af nvidia-cuda-mps
python3 "$D/client.py" 1 "$D/stop" & PIDS+=($!)
python3 "$D/client.py" 2 "$D/stop" & PIDS+=($!)
for _ in $(seq 60); do [ "$(grep -c holds "$OUT/probe_mps.log")" -ge 2 ] && break; sleep 1; done
SRV=$(pgrep -f nvidia-cuda-mps-server | head -1); CTL=$(pgrep -f 'nvidia-cuda-mps-control' | head -1)
echo "== server $SRV control $CTL clients ${PIDS[*]}"
echo get_server_list | nvidia-cuda-mps-control; echo "get_client_list $SRV" | nvidia-cuda-mps-control
facts "two clients" "$SRV" "$CTL"
ls -la "$CUDA_MPS_PIPE_DIRECTORY"
kill -TERM "${PIDS[0]}"; wait "${PIDS[0]}"; echo "== client 1 SIGTERM: exit $?"
sleep 1; facts "one client left" "$SRV"
touch "$D/stop"; wait "${PIDS[1]}"; echo "== client 2 exit $?"
sleep 2; facts "idle server" "$SRV"
echo get_server_list | nvidia-cuda-mps-control
echo quit | timeout 20 nvidia-cuda-mps-control; sleep 2; facts "after quit"

echo "== a torch process whose main thread calls pthread_exit"
cat > "$D/zleader.py" <<'PY'
import ctypes, os, threading, time, torch
x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda"); torch.cuda.synchronize()
stop = os.environ["STOP"]
def keep():
    while not os.path.exists(stop):
        time.sleep(0.05)
    os._exit(0)
threading.Thread(target=keep).start()
print(f"zleader {os.getpid()} holds 1 GiB; main thread exits", flush=True)
ctypes.CDLL(None).pthread_exit(None)
PY
STOP=$D/zstop python3 "$D/zleader.py" & Z=$!; PIDS+=($Z)
for _ in $(seq 60); do grep -q zleader "$OUT/probe_mps.log" && break; sleep 1; done; sleep 1
facts "leader exited, thread holds" "$Z"
touch "$D/zstop"; wait "$Z"; echo "== zleader exit $?"
sleep 1; facts "zleader gone"
echo "== done"
