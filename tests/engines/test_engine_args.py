"""Commands read by each engine's own parser rules: gpuslate's scanner against CPython's argparse
itself (SGLang's and vLLM's parsers are argparse with its default allow_abbrev=True) over drawn
option sets and command lines, and against click's rule (trtllm-serve: whole names only); and the
engines' readings of abbreviated and ambiguous commands (issue 32: an abbreviated blocker is a
blocker, an ambiguous prefix a blocker named as such)."""

from __future__ import annotations

import argparse
import json

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from engine_facts import argparse_resolve, click_resolve
from gpuslate.engines import ApplyStatus, plan_apply, read_command
from gpuslate.engines.args import OptionTable, Style, scan
from gpuslate.engines.sglang import OPTIONS as SGLANG_OPTIONS
from gpuslate.engines.trtllm import OPTIONS as TRTLLM_OPTIONS
from gpuslate.engines.vllm import OPTIONS as VLLM_OPTIONS

WORDS = st.sampled_from(["spec", "speculative", "enable", "dp", "attention", "size", "model", "path", "num",
                         "steps", "a", "b"])
OPTION = st.lists(WORDS, min_size=1, max_size=3).map(lambda ws: "--" + "-".join(ws))


class Refused(Exception):
    pass


class Oracle(argparse.ArgumentParser):
    def error(self, message: str):  # type: ignore[override]
        raise Refused(message)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(OPTION, min_size=1, max_size=2, unique=True), min_size=1, max_size=6), st.data())
def test_the_scanner_resolves_a_prefix_as_argparse_does(groups, data):
    names = [n for g in groups for n in g]
    assume(len(set(names)) == len(names))
    table = OptionTable(Style.ARGPARSE, valued=tuple(tuple(g) for g in groups))
    oracle = Oracle(add_help=False)
    for g in groups:
        oracle.add_argument(*g, dest=g[0][2:].replace("-", "_"))
    full = data.draw(st.sampled_from(names))
    given_name = full[: data.draw(st.integers(3, len(full)))]
    eq = data.draw(st.booleans())
    argv = [given_name + "=v"] if eq else [given_name, "v"]
    s = scan(argv, 0, table)
    try:
        ns, rest = oracle.parse_known_args(argv)
    except Refused as exc:
        assert "ambiguous option" in str(exc) and s.ambiguous and not s.found, (argv, s)
        return
    hit = {k: v for k, v in vars(ns).items() if v is not None}
    if not hit:  # argparse took it for no option (not a prefix of any)
        assert not s.found and not s.ambiguous
        return
    assert len(s.found) == 1 and s.found[0].value == "v" and not rest
    assert hit == {s.found[0].name[2:].replace("-", "_"): "v"}
    assert argparse_resolve(names, argv[0]) in next(g for g in groups if g[0] == s.found[0].name)


def test_whole_names_only_for_click():
    table = TRTLLM_OPTIONS
    s = scan(["m", "--extra_llm_api_opt", "f.yaml", "--config", "g.yaml", "--tp_size", "8"], 0, table)
    assert s.value("--extra_llm_api_options") == "g.yaml"  # --config is its other name
    assert [w for w, _ in s.refused] == ["--extra_llm_api_opt"]
    with pytest.raises(KeyError, match="No such option"):
        click_resolve(["--extra_llm_api_options", "--config"], "--extra_llm_api_opt")
    assert scan(["--tp-size", "8"], 0, table).found == ()  # click does not turn '-' into '_'


def test_vllm_underscores_abbreviations_and_short_options():
    s = scan(["serve", "m", "--speculative_conf", "{}", "-dp", "2", "--max_num_seq=4"], 0, VLLM_OPTIONS)
    assert [(o.name, o.value, o.abbreviated) for o in s.found] == [
        ("--speculative-config", "{}", True), ("--data-parallel-size", "2", False), ("--max-num-seqs", "4", True)]
    assert scan(["--data-parallel-siz", "2"], 0, VLLM_OPTIONS).ambiguous[0][1] == (
        "--data-parallel-size", "--data-parallel-size-local")


def test_sglang_abbreviated_blocker_is_a_blocker_and_an_ambiguous_one_is_named():
    base = ["python3", "-m", "sglang.launch_server", "--model-path", "m", "--tp", "8", "--speculative-algo",
            "EAGLE3", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1"]
    cmd = read_command([*base, "--enable-dp-att"])
    assert [b.setting for b in cmd.blockers] == ["--enable-dp-attention"]  # issue 32: it passed before
    assert any("--enable-dp-att is read as --enable-dp-attention" in n for n in cmd.notes)
    plan = plan_apply(read_command([*base, "--enable-two"]), 1, top=8, out_dir="/o", version=None)
    assert plan.status is ApplyStatus.BLOCKED and [b.setting for b in plan.blockers] == ["--enable-two-batch-overlap"]
    amb = plan_apply(read_command([*base, "--enable-dp"]), 1, top=8, out_dir="/o", version=None)
    assert amb.status is ApplyStatus.BLOCKED and not amb.files
    assert amb.blockers[0].setting == "--enable-dp" and amb.blockers[0].why.startswith("ambiguous option")
    assert "--enable-dp-attention" in amb.blockers[0].why and "--enable-dp-lm-head" in amb.blockers[0].why
    assert scan(["--speculative-adap"], 0, SGLANG_OPTIONS).ambiguous  # the flag and its config


def test_vllm_ambiguous_prefix_and_abbreviated_data_parallel_block():
    spec = json.dumps({"method": "eagle3", "model": "d", "num_speculative_tokens": 3})
    plan = plan_apply(read_command(["vllm", "serve", "m", "--speculative-conf", spec, "--data-parallel-s", "2"]), 1,
                      top=8, out_dir="/o", version="0.25.0")
    assert plan.status is ApplyStatus.BLOCKED and plan.blockers[0].why.startswith("ambiguous option")
    plan = plan_apply(read_command(["vllm", "serve", "m", "--speculative-conf", spec, "--data-parallel-size=2"]), 1,
                      top=8, out_dir="/o", version="0.25.0")
    assert plan.status is ApplyStatus.BLOCKED and "data parallelism > 1" in plan.blockers[0].why
    ok = plan_apply(read_command(["vllm", "serve", "m", "--speculative-conf", spec]), 1, top=8, out_dir="/o",
                    version="0.25.0")
    assert ok.status is ApplyStatus.READY and ok.command[3] == "--speculative-config"  # written whole


def test_emulated_engines_refuse_as_their_parsers_do():
    from gpuslate.simserver.engineargs import settings

    def emulate(engine: str, *args: str) -> None:
        settings(engine, list(args), version=None, max_batch=64, read_file=lambda p: "")

    with pytest.raises(ValueError, match="ambiguous option: --enable-dp"):
        emulate("sglang", "--model-path", "m", "--enable-dp")
    with pytest.raises(ValueError, match="ambiguous option: --data-parallel-siz"):
        emulate("vllm", "serve", "m", "--data-parallel-siz", "2")
    with pytest.raises(ValueError, match="No such option: --por"):
        emulate("trtllm", "m", "--por", "8000")
    assert settings("sglang", ["--tp", "8", "--por", "1234"], version=None, max_batch=64,
                    read_file=lambda p: "").values["port"] == 1234  # an unambiguous prefix is the option
