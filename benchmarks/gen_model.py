"""A generated model for the device runs (no network there): a Llama-shaped network with random weights
and a word-level tokenizer whose words are one token each, saved as a Hugging Face folder that
``transformers serve DIR`` loads.

    python3 benchmarks/gen_model.py DIR

Greedy decoding of it is deterministic for a given set of weights (seed 0), so the same prompt gives
the same tokens before and after a park; it never emits an end of sequence (every request generates
max_tokens).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from gpuslate.bench.prompts import WORDS


def main(out: Path) -> None:
    words = sorted({w.strip() for w in WORDS} | {f"w{i}" for i in range(400)})
    # sentencepiece-style words ("▁the"): decoded one token at a time (as servers stream) they keep their
    # spaces, so re-tokenizing the streamed text counts exactly the tokens generated
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{"\u2581" + w: i + 3 for i, w in enumerate(words)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always")
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                   pad_token="<unk>")
    fast.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    fast.save_pretrained(out)
    cfg = LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16,
                      num_key_value_heads=4, vocab_size=len(vocab), max_position_embeddings=4096,
                      bos_token_id=1, eos_token_id=None, pad_token_id=0, torch_dtype="bfloat16")
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.generation_config.eos_token_id = None  # never stops early: every request generates max_tokens
    model.save_pretrained(out)
    print(f"model: {sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters, vocab {len(vocab)}, in {out}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
