"""Swap downtime on a real GPU with a real checkpoint: with and without weight prefetch.

    PYTHONUNBUFFERED=1 python3 benchmarks/bench_swap_downtime.py --out DIR [--size-gb 22] [--runs 2]
        [--script /path/to/gpuslate] [--dir FOLDER] [--budget-s 450]

1. Writes a randomly initialised Llama-shaped checkpoint (bf16, safetensors
   shards, ``config.json``, an index) of about ``--size-gb`` GB into a folder on
   a real disk (not tmpfs: a checkpoint in RAM cannot be dropped from the
   cache), or reuses it when it is already there.
2. Defines two units A and B of ``swap_server.py`` (an aiohttp OpenAI-compatible
   server that loads every tensor to the GPU with safetensors) with
   ``--model-path`` naming the checkpoint, ``engine = "sglang"`` and a smoke
   completion; starts A.
3. Each run: drops the page cache (``sync; echo 3 > /proc/sys/vm/drop_caches``,
   and ``POSIX_FADV_DONTNEED`` on every shard, which needs no privilege), checks
   with ``mincore`` how much of the checkpoint is still cached, then
   ``gpuslate swap OLD NEW --json`` (alternately with ``--no-prefetch``), and
   records the downtime, its parts, the prefetch, and the new server's own
   timeline (its process start, port bound, weights loaded).

"gpuslate adds" = downtime - the old server's teardown (stop + memory release)
- the new server's own start (its process start to its weights on the GPU)
- the smoke completion: the pre-flight, the spawn and the readiness poll's latency.
Progress is printed with timestamps; everything goes to ``--out``
(``bench-swap-downtime.json``, ``.md``, ``.log``). Stops starting new runs when
``--budget-s`` would be exceeded.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
LOG: list[str] = []
T0 = time.monotonic()


def log(msg: str) -> None:
    line = f"[{time.strftime('%H:%M:%S', time.gmtime())}Z +{time.monotonic() - T0:6.1f}s] {msg}"
    LOG.append(line)
    print(line, flush=True)


# -- the checkpoint -------------------------------------------------------------------

def llama_shapes(size_bytes: int) -> tuple[dict, list[tuple[str, list[int]]]]:
    """A Llama-2-13B-like config with as many layers as make ``size_bytes`` in bf16."""
    h, inter, vocab, heads = 5120, 13824, 32000, 40
    per_layer = 4 * h * h + 3 * h * inter + 2 * h
    fixed = 2 * vocab * h + h
    layers = max(1, (size_bytes // 2 - fixed) // per_layer)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": h,
              "intermediate_size": inter, "num_hidden_layers": int(layers), "num_attention_heads": heads,
              "num_key_value_heads": heads, "vocab_size": vocab, "max_position_embeddings": 4096,
              "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16", "tie_word_embeddings": False}
    tensors = [("model.embed_tokens.weight", [vocab, h])]
    for i in range(int(layers)):
        p = f"model.layers.{i}."
        tensors += [(p + "self_attn.q_proj.weight", [h, h]), (p + "self_attn.k_proj.weight", [h, h]),
                    (p + "self_attn.v_proj.weight", [h, h]), (p + "self_attn.o_proj.weight", [h, h]),
                    (p + "mlp.gate_proj.weight", [inter, h]), (p + "mlp.up_proj.weight", [inter, h]),
                    (p + "mlp.down_proj.weight", [h, inter]), (p + "input_layernorm.weight", [h]),
                    (p + "post_attention_layernorm.weight", [h])]
    tensors += [("model.norm.weight", [h]), ("lm_head.weight", [vocab, h])]
    return config, tensors


def random_pool(nbytes: int) -> memoryview:
    """Random bf16 values, N(0, 0.02), reused for every tensor. Made on the CPU: a CUDA
    context in this process would hold GPU memory and fail the units' pre-flight."""
    try:
        import numpy as np

        x = np.random.default_rng(0).standard_normal(nbytes // 2, dtype=np.float32) * np.float32(0.02)
        return memoryview((x.view(np.uint32) >> 16).astype(np.uint16).tobytes())  # bf16: float32's top half
    except ImportError:
        return memoryview(os.urandom(nbytes))


def write_checkpoint(folder: Path, size_gb: float, shard_gb: float = 4.0) -> dict:
    """Safetensors shards written directly (8-byte header length, JSON header, raw data)."""
    done = folder / "complete.json"
    if done.exists():
        info = json.loads(done.read_text())
        if abs(info["size_gb"] - size_gb) < 0.01:
            log(f"reusing the checkpoint in {folder} ({info['bytes'] / 1e9:.1f} GB)")
            return info
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    config, tensors = llama_shapes(int(size_gb * 1e9))
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    pool = random_pool(128 * 2**20)  # 64 M random values, cycled through with a moving offset
    shards: list[list[tuple[str, list[int]]]] = [[]]
    acc = 0
    for name, shape in tensors:
        n = 2 * _numel(shape)
        if acc + n > shard_gb * 1e9 and shards[-1]:
            shards.append([])
            acc = 0
        shards[-1].append((name, shape))
        acc += n
    weight_map: dict[str, str] = {}
    total = 0
    t0 = time.monotonic()
    off = 0
    for k, shard in enumerate(shards):
        fname = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        header: dict = {"__metadata__": {"format": "pt"}}
        pos = 0
        for name, shape in shard:
            n = 2 * _numel(shape)
            header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [pos, pos + n]}
            pos += n
            weight_map[name] = fname
        hb = json.dumps(header, separators=(",", ":")).encode()
        hb += b" " * (-len(hb) % 8)
        with open(folder / fname, "wb", buffering=0) as f:
            f.write(len(hb).to_bytes(8, "little") + hb)
            for name, shape in shard:
                n = 2 * _numel(shape)
                while n:
                    take = min(n, len(pool) - off)
                    f.write(pool[off:off + take])
                    n -= take
                    off = (off + take) % len(pool) or 4096  # rotate, so tensors differ
        total += (folder / fname).stat().st_size
        log(f"wrote {fname} ({(folder / fname).stat().st_size / 1e9:.2f} GB), {total / 1e9:.1f} GB so far")
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total},
                                                                     "weight_map": weight_map}))
    os.sync()
    info = {"size_gb": size_gb, "bytes": total, "shards": len(shards), "layers": config["num_hidden_layers"],
            "write_s": round(time.monotonic() - t0, 1)}
    done.write_text(json.dumps(info))
    log(f"checkpoint written and synced: {total / 1e9:.1f} GB in {info['write_s']} s")
    return info


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def shards_of(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.safetensors"))


# -- the page cache --------------------------------------------------------------------

_libc = ctypes.CDLL(None, use_errno=True)


def resident(paths: list[Path]) -> float:
    """Fraction of the files' pages in the page cache (mincore)."""
    page = mmap.PAGESIZE
    total = cached = 0
    for p in paths:
        size = p.stat().st_size
        if not size:
            continue
        with open(p, "rb") as f:
            mm = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY)  # private: never written back
            try:
                npages = (size + page - 1) // page
                vec = (ctypes.c_ubyte * npages)()
                anchor = ctypes.c_char.from_buffer(mm)
                rc = _libc.mincore(ctypes.c_void_p(ctypes.addressof(anchor)), ctypes.c_size_t(size), vec)
                del anchor  # the mapping can be closed only once nothing points into it
                if rc != 0:
                    return -1.0
                cached += sum(b & 1 for b in bytes(vec))
                total += npages
            finally:
                mm.close()
    return cached / total if total else 0.0


def drop_cache(paths: list[Path]) -> str:
    """Drop the checkpoint from the page cache; say how."""
    os.sync()
    how = []
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        how.append("drop_caches")
    except OSError as exc:
        how.append(f"drop_caches not permitted ({exc.strerror})")
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    how.append("fadvise DONTNEED")
    return ", ".join(how)


# -- gpuslate ----------------------------------------------------------------------------

def pick_dir(requested: str | None, need: int) -> Path:
    """A folder on a real disk (not tmpfs/ramfs) with room for the checkpoint."""
    mounts = []
    with open("/proc/mounts") as f:
        for line in f:
            dev, mnt, fstype = line.split()[:3]
            mounts.append((mnt, fstype, dev))

    def fs_of(path: Path) -> tuple[str, str]:
        path = path.resolve()
        best = max((m for m in mounts if str(path).startswith(m[0].rstrip("/") + "/") or str(path) == m[0]),
                   key=lambda m: len(m[0]))
        return best[1], best[2]

    candidates = [Path(requested)] if requested else [Path("/var/tmp/gpuslate-ckpt"), Path.home() / "gpuslate-ckpt",
                                                      ROOT.parent / "gpuslate-ckpt", Path("/tmp/gpuslate-ckpt")]
    for c in candidates:
        base = c if c.exists() else c.parent
        if not base.exists():
            continue
        fstype, dev = fs_of(base)
        free = shutil.disk_usage(base).free + (sum(p.stat().st_size for p in c.glob("*")) if c.exists() else 0)
        if fstype in ("tmpfs", "ramfs"):
            log(f"{c}: on {fstype}: in RAM, the cache cannot be dropped; not used")
            continue
        if free < need * 1.05:
            log(f"{c}: {free / 1e9:.1f} GB free, {need / 1e9:.1f} GB needed; not used")
            continue
        log(f"checkpoint folder {c} on {fstype} ({dev}), {free / 1e9:.1f} GB free")
        return c
    raise SystemExit("no folder on a real disk with enough room: pass --dir")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_info(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/get_server_info", timeout=10) as r:
        return json.loads(r.read())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--size-gb", type=float, default=22.0)
    ap.add_argument("--runs", type=int, default=2, help="swaps with and without prefetch each (default 2)")
    ap.add_argument("--dir", help="checkpoint folder (default: the first of /var/tmp, ~, .. not in RAM)")
    ap.add_argument("--gpu", default="0")
    ap.add_argument("--script", help="the installed `gpuslate` console script (default: python -m gpuslate)")
    ap.add_argument("--budget-s", type=float, default=450, help="start no run that would end after this")
    ap.add_argument("--keep", action="store_true", help="keep the checkpoint (default: removed at the end)")
    a = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a time limit still runs `down A/B` below
    a.out.mkdir(parents=True, exist_ok=True)
    folder = pick_dir(a.dir, int(a.size_gb * 1e9))
    ck = write_checkpoint(folder, a.size_gb)
    shards = shards_of(folder)
    tmp = Path(tempfile.mkdtemp(prefix="bench-swap-"))
    env = {k: v for k, v in os.environ.items() if k != "GPUSLATE_SIM"}
    env.update(GPUSLATE_STATE_DIR=str(tmp / "state"), GPUSLATE_LOCK_DIR=str(tmp / "locks"), PYTHONUNBUFFERED="1")
    if not a.script:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"), env.get("PYTHONPATH")) if p)
    gs = [a.script] if a.script else [sys.executable, "-m", "gpuslate"]
    port = free_port()
    units = ""
    for name in ("A", "B"):
        cmd = [sys.executable, str(HERE / "swap_server.py"), "--model-path", str(folder), "--port", str(port),
               "--name", name]
        units += (f"[units.{name}]\ncommand = {json.dumps(cmd)}\ngpus = \"{a.gpu}\"\nport = {port}\n"
                  "engine = \"sglang\"\nsmoke = true\nstart_timeout = 600\ngrace = 10\n\n")
    (tmp / "gpuslate.toml").write_text(units)

    def gpuslate(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*gs, *args], capture_output=True, text=True, env=env, cwd=tmp, timeout=timeout)

    runs: list[dict] = []
    try:
        t = time.monotonic()
        r = gpuslate("up", "A", "--json")
        if r.returncode != 0:
            log(f"up A failed ({r.returncode}): {r.stderr[-1500:]}")
            return 6
        log(f"A up in {time.monotonic() - t:.1f} s (first load: {server_info(port).get('load_s', 0):.1f} s)")
        old, new = "A", "B"
        plan = [p for _ in range(a.runs) for p in (False, True)]
        longest = 0.0
        for i, prefetch in enumerate(plan):
            elapsed = time.monotonic() - T0
            if elapsed + longest * 1.2 > a.budget_s:
                log(f"stopping: {elapsed:.0f} s used, another run may take {longest:.0f} s (budget {a.budget_s:.0f} s)")
                break
            t_run = time.monotonic()
            how = drop_cache(shards)
            cold = resident(shards)
            log(f"run {i + 1}/{len(plan)}: swap {old} -> {new} {'with' if prefetch else 'WITHOUT'} prefetch; "
                f"page cache dropped ({how}): {cold:.1%} of the checkpoint cached")
            args = ["swap", old, new, "--json"] + ([] if prefetch else ["--no-prefetch"])
            r = gpuslate(*args)
            if r.returncode != 0:
                log(f"swap failed ({r.returncode}): {r.stderr[-1500:]}")
                return 6
            doc = json.loads(r.stdout)
            srv = server_info(port)
            dt = doc["downtime"]
            teardown = dt["stop_old_s"] + dt["verify_clean_s"]
            own = srv["ready_at"] - srv["process_started_at"]
            smoke = dt.get("smoke_new_s", 0.0)
            rec = {"run": i + 1, "prefetch": prefetch, "cached_before": round(cold, 4), "drop": how,
                   "downtime_s": doc["downtime_s"], "downtime": dt, "phases": doc["phases"], "total_s": doc["total_s"],
                   "prefetch_report": doc["prefetch"], "old_teardown_s": teardown, "server_own_start_s": own,
                   "server_load_s": srv["load_s"],
                   "server_port_bound_after_s": srv["port_bound_at"] - srv["process_started_at"],
                   "bytes_loaded": srv["bytes_loaded"], "gpuslate_adds_s": doc["downtime_s"] - teardown - own - smoke,
                   "stderr": r.stderr.strip().splitlines()[-6:]}
            runs.append(rec)
            pf = doc["prefetch"] or {}
            log(f"  downtime {doc['downtime_s']:.2f} s (old teardown {teardown:.2f}, new server's own start {own:.2f} "
                f"of which loading {srv['load_s']:.2f}; gpuslate adds {rec['gpuslate_adds_s']:.3f}); "
                f"prefetch {pf.get('status', 'off')} {pf.get('read_bytes', 0) / 1e9:.1f} GB in "
                f"{pf.get('seconds') or 0:.1f} s before the stop; swap total {doc['total_s']:.1f} s")
            longest = max(longest, time.monotonic() - t_run)
            old, new = new, old
    finally:
        for n in ("A", "B"):
            gpuslate("down", n, timeout=120)
        if not a.keep:
            shutil.rmtree(folder, ignore_errors=True)
    md = markdown(runs, ck, a, folder)
    print(md)
    meta = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "host": platform.node(),
            "python": platform.python_version(), "checkpoint": ck, "folder": str(folder),
            "command": "python3 benchmarks/bench_swap_downtime.py " + " ".join(sys.argv[1:]),
            "gpuslate_invoked_as": " ".join(gs), "wall_s": round(time.monotonic() - T0, 1)}
    (a.out / "bench-swap-downtime.json").write_text(json.dumps({"meta": meta, "runs": runs}, indent=1))
    (a.out / "bench-swap-downtime.md").write_text(md + "\n")
    (a.out / "bench-swap-downtime.log").write_text("\n".join(LOG) + "\n")
    return 0


def markdown(runs: list[dict], ck: dict, a: argparse.Namespace, folder: Path) -> str:
    def med(key: str, pf: bool) -> str:
        v = [r[key] for r in runs if r["prefetch"] == pf]
        return f"{statistics.median(v):.2f}" if v else "-"

    def part(key: str, pf: bool) -> str:
        v = [r["downtime"].get(key) for r in runs if r["prefetch"] == pf and r["downtime"].get(key) is not None]
        return f"{statistics.median(v):.2f}" if v else "-"

    def pfread(pf: bool) -> str:
        v = [(r["prefetch_report"] or {}).get("seconds") for r in runs if r["prefetch"] == pf]
        v = [x for x in v if x]
        return f"{statistics.median(v):.2f}" if v else "-"

    rows = [("**downtime** (old told to stop -> new ready + smoke)", lambda pf: f"**{med('downtime_s', pf)}**"),
            ("stop old", lambda pf: part("stop_old_s", pf)), ("verify clean", lambda pf: part("verify_clean_s", pf)),
            ("pre-flight + spawn new", lambda pf: _sum2(runs, pf)),
            ("process start -> port open", lambda pf: part("start_to_port_open_s", pf)),
            ("port open -> ready (weights to GPU)", lambda pf: part("port_open_to_ready_s", pf)),
            ("smoke completion", lambda pf: part("smoke_new_s", pf)),
            ("new server's own load (its clock)", lambda pf: med("server_load_s", pf)),
            ("gpuslate adds (downtime - teardown - server's own start - smoke)", lambda pf: med("gpuslate_adds_s", pf)),
            ("prefetch read, before the stop (old serves)", lambda pf: pfread(pf)),
            ("swap total", lambda pf: med("total_s", pf))]
    n_off = sum(1 for r in runs if not r["prefetch"])
    n_on = sum(1 for r in runs if r["prefetch"])
    lines = [f"- Checkpoint: {ck['bytes'] / 1e9:.1f} GB bf16 in {ck['shards']} safetensors shards "
             f"(Llama-shaped, {ck['layers']} layers), in {folder}; page cache dropped before every swap "
             f"({runs[0]['drop'] if runs else '-'}; cached before: "
             f"{max((r['cached_before'] for r in runs), default=0):.1%} at most).", "",
             f"| median seconds | without prefetch ({n_off} runs) | with prefetch ({n_on} runs) |",
             "| --- | ---: | ---: |"]
    lines += [f"| {label} | {fn(False)} | {fn(True)} |" for label, fn in rows]
    return "\n".join(lines)


def _sum2(runs: list[dict], pf: bool) -> str:
    v = [r["downtime"]["preflight_new_s"] + r["downtime"]["spawn_new_s"] for r in runs if r["prefetch"] == pf]
    return f"{statistics.median(v):.3f}" if v else "-"


if __name__ == "__main__":
    sys.exit(main())
