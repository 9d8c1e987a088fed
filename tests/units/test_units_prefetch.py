"""Swap downtime and weight prefetch on the simulated host: the new unit's model folder is
read before the old unit is told to stop; a prefetch that would not fit is skipped with a
warning; the downtime's parts add up to it. Detection and the fit decision are pure."""

from __future__ import annotations

import json
import os

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuslate import Host, SwapOptions
from gpuslate.units.prefetch import FIT_FRACTION, decide, model_paths, plan_prefetch
from unitkit import free_port, serve_cmd

MiB = 1024**2


def make_model(folder, shards: int = 2, shard_mib: int = 6):
    folder.mkdir()
    (folder / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    for i in range(shards):
        (folder / f"model-{i + 1:05d}-of-{shards:05d}.safetensors").write_bytes(os.urandom(shard_mib * MiB))
    return folder, sum(f.stat().st_size for f in folder.iterdir())


def write_toml(path, port: int, model) -> None:
    def unit(name: str, *extra: str) -> str:
        cmd = json.dumps(serve_cmd(port, *extra, startup=0.3))
        return (f"[units.{name}]\ncommand = {cmd}\ngpus = \"0-7\"\nport = {port}\nengine = \"sglang\"\n"
                "start_timeout = 30\ngrace = 5\n\n")

    # vLLM-style: the served model is named by its folder
    path.write_text(unit("baseline") + unit("next", "--model", str(model)))


def signal_times(cli_log: str) -> list[str]:
    return [e["time"] for e in json.loads(cli_log)["entries"] if e.get("signal") == "SIGTERM"]


def test_swap_prefetches_the_model_folder_before_stopping_the_old_unit(units_host, units, tmp_path):
    port = free_port()
    model, size = make_model(tmp_path / "llama-tiny")
    write_toml(tmp_path / "gpuslate.toml", port, model)
    assert units("up", "baseline", cwd=str(tmp_path)).returncode == 0
    r = units("swap", "baseline", "next", "--json", cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    pf = doc["prefetch"]
    assert pf["status"] == "done" and pf["paths"] == [str(model)]
    assert pf["files"] == 3 and pf["bytes"] == size and pf["read_bytes"] == size
    assert "prefetching" in r.stderr
    # ordering evidence: the read ended before the old unit was told to stop, and before
    # the first SIGTERM of the swap in the audit log (written before it was sent)
    log = units("log", "--json", cwd=str(tmp_path))
    sigterms = [t for t in signal_times(log.stdout) if t >= pf["started_at"]]
    assert sigterms and pf["finished_at"] <= doc["stop_old_at"] <= min(sigterms)
    assert doc["phases"]["prefetch_wait_s"] >= 0
    # the downtime: old told to stop -> new ready, in parts that add up
    down, parts = doc["downtime_s"], doc["downtime"]
    assert 0 < down < doc["total_s"]
    main = ("stop_old_s", "verify_clean_s", "preflight_new_s", "spawn_new_s", "start_to_ready_s", "smoke_new_s")
    assert abs(sum(parts[k] for k in main) - down) < 0.005, parts
    assert abs(parts["start_to_port_open_s"] + parts["port_open_to_ready_s"] - parts["start_to_ready_s"]) < 0.002
    assert parts["port_open_to_ready_s"] > 0.1  # the server binds, then loads for 0.3 s
    assert parts["stop_old_s"] == doc["phases"]["stop_old_s"]
    # the table shows both; --no-prefetch turns it off
    back = units("swap", "next", "baseline", cwd=str(tmp_path))
    assert back.returncode == 0, back.stderr
    assert "downtime (nothing serves)" in back.stdout and "port open -> ready" in back.stdout
    again = units("swap", "baseline", "next", "--no-prefetch", "--json", cwd=str(tmp_path))
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["prefetch"] is None and "prefetching" not in again.stderr


def test_prefetch_that_would_not_fit_is_skipped_with_a_warning(units_host, tmp_path):
    port = free_port()
    model, size = make_model(tmp_path / "llama-big", shards=1, shard_mib=4)
    write_toml(tmp_path / "gpuslate.toml", port, model)
    from gpuslate.units import resolve

    events: list[str] = []
    host = Host.open(on_event=events.append)
    assert host.up(resolve("baseline")).ok
    res = host.swap("baseline", "next", SwapOptions(prefetch_memory=size))  # 90 % of it fits, not all
    assert res.ok, res.up.record.failure if res.up else res.status
    pf = res.prefetch
    assert pf is not None and pf.status == "skipped" and pf.read_bytes == 0
    assert "would not fit" in (pf.plan.warning or "") and pf.plan.warning in events
    assert res.to_json()["prefetch"]["available"] == size
    assert "prefetch_wait_s" in res.phases and res.downtime_s is not None


# -- the pure parts ------------------------------------------------------------

_word = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_./", min_size=1, max_size=12)
_token = st.one_of(_word, _word.map(lambda w: "--" + w.strip("-") if w.strip("-") else "--x"))


@settings(max_examples=200, deadline=None)
@given(before=st.lists(_token, max_size=6), after=st.lists(_token, max_size=6),
       flag=st.sampled_from(["--model-path", "--model", "--model-dir"]), inline=st.booleans())
def test_model_option_value_is_found_and_nothing_else_exists(before, after, flag, inline):
    model = "/models/llama"
    args = [f"{flag}={model}"] if inline else [flag, model]
    cmd = ["python", *before, *args, *after]
    found = model_paths(cmd, exists=lambda p: p == model, is_model_dir=lambda p: False)
    assert found == [model]
    # a word that names nothing on this host is never taken for a model
    assert model_paths(cmd, exists=lambda p: False, is_model_dir=lambda p: False) == []


@given(before=st.lists(_word, max_size=4))
def test_positional_model_folder_found(before):
    cmd = ["vllm", "serve", *before, "/models/qwen"]
    assert model_paths(cmd, exists=lambda p: True, is_model_dir=lambda p: p == "/models/qwen") == ["/models/qwen"]


@given(sizes=st.lists(st.integers(0, 2**40), min_size=1, max_size=8), available=st.integers(0, 2**41))
def test_fits_only_as_a_whole(sizes, available):
    files = [(f"/m/{i}", s) for i, s in enumerate(sizes)]
    plan = decide(["/m"], files, available)
    assert plan.total == sum(sizes)
    assert plan.fits == (sum(sizes) <= FIT_FRACTION * available)
    assert (plan.warning is None) == plan.fits


def test_explicit_prefetch_list_wins_and_empty_turns_it_off(tmp_path):
    _, size = make_model(tmp_path / "m", shards=1, shard_mib=1)
    _, other_size = make_model(tmp_path / "other", shards=1, shard_mib=1)
    cmd = ["python", "-m", "sglang.launch_server", "--model-path", "m"]
    assert plan_prefetch(cmd, None, cwd=str(tmp_path), available=2**40).total == size  # relative to cwd
    assert plan_prefetch(cmd, ["other"], cwd=str(tmp_path), available=2**40).total == other_size
    off = plan_prefetch(cmd, [], cwd=str(tmp_path), available=2**40)
    assert off.files == [] and not off.fits and off.warning is None
