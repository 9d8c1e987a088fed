"""Text from processes made safe and short: command lines cut from the middle, keeping the part
that names the program (what a person needs to tell one server from another)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuslate._text import program_end, short_command

ARGS = " --model-path /models/meta-llama/Meta-Llama-3.1-405B-Instruct-FP8 --tensor-parallel-size 8 --port 30000"


@pytest.mark.parametrize("command,names", [
    ("python3 -m sglang.launch_server" + ARGS, "python3 -m sglang.launch_server"),
    ("/tmp/x/.venv/bin/python3 /tmp/x/.venv/bin/vllm serve /models/Llama --port 8000", "/tmp/x/.venv/bin/vllm serve"),
    ("python3.11 -u -X dev -W ignore train.py --lr 3e-4", "train.py"),
    ("/usr/bin/env CUDA_VISIBLE_DEVICES=0 python3 -m torch.distributed.run --nproc-per-node 8 x.py",
     "python3 -m torch.distributed.run"),
    ("bash run_server.sh --port 1", "bash run_server.sh"),
    ("sglang::scheduler_TP0" + ARGS, "sglang::scheduler_TP0"),
    ("torchrun --nproc-per-node 8 train.py", "torchrun"),
])
def test_the_part_naming_the_program(command: str, names: str) -> None:
    words = command.split(" ")
    assert names in " ".join(words[:program_end(words)])
    shown = short_command(command, 60)
    assert len(shown) <= 60 and (names.rsplit("/", 1)[-1] in shown)


def test_cut_from_the_middle_and_never_when_piped() -> None:
    cmd = "/tmp/x/.venv/bin/python3 /tmp/x/.venv/bin/vllm serve /models/Llama --port 8000 --tp 8"
    assert short_command(cmd, 60) == "…/python3 /tmp/x/.venv/bin/vllm serve … --port 8000 --tp 8"
    assert short_command(cmd, 31) == "…/python3 …/vllm serve … --tp 8"
    assert short_command("python3 -m sglang.launch_server" + ARGS, 48) == \
        "python3 -m sglang.launch_server … 8 --port 30000"
    assert short_command(cmd, None) == cmd == short_command(cmd, len(cmd))


@settings(max_examples=500, deadline=None)
@given(st.lists(st.text(st.characters(blacklist_characters=" ", blacklist_categories=("Cs",)), min_size=1,
                        max_size=40), min_size=1, max_size=12), st.integers(1, 120))
def test_never_longer_than_the_limit(words: list[str], limit: int) -> None:
    text = " ".join(words)
    shown = short_command(text, limit)
    assert len(shown) <= limit
    if len(text) <= limit:
        assert shown == text
