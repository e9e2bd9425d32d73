"""Build a tiny random-weight Llama and its tokenizer in a directory, with no hub download.

Usage: .venv-vllm/bin/python scripts/make_tiny_model.py OUT_DIR [--vocab 4096] [--seed 0]

Why: the real-vLLM tests need a model vLLM can load, on a CPU, in seconds, on machines that
reach no model hub. A 2-layer, 128-wide Llama with a 4,096-token byte-level BPE vocabulary
loads in a few seconds and prefills thousands of tokens per second on one core; its outputs
are noise, which is fine: the tests measure the prefix cache, not the text.
The tokenizer is trained here on deterministic pseudo-text so the directory is identical
from run to run (same seed, same files), and is byte-level so any prompt text tokenizes.
Needs torch, transformers and tokenizers (the vLLM environment has them).
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Iterator
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
SPECIAL = ["<s>", "</s>", "<unk>", "<pad>"]


def corpus(seed: int, words: int = 60_000) -> Iterator[str]:
    """Deterministic pseudo-English: enough distinct character pairs for thousands of merges."""
    rng = random.Random(seed)
    letters = "etaoinshrdlcumwfgypbvkjxqz"
    weights = [13, 9, 8, 8, 7, 7, 6, 6, 6, 4, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1]
    vocab = ["".join(rng.choices(letters, weights, k=rng.randint(1, 9))) for _ in range(6_000)]
    line: list[str] = []
    for _ in range(words):
        line.append(rng.choice(vocab) + rng.choice(["", "", "", "", ",", ".", "?", "0", "42"]))
        if len(line) == 16:
            yield " ".join(line)
            line = []


def build_tokenizer(out: Path, vocab_size: int, seed: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus(seed), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
        pad_token="<pad>",
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)


def build_model(out: Path, vocab_size: int, seed: int) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        max_position_embeddings=8192, bos_token_id=0, eos_token_id=1, pad_token_id=3,
        tie_word_embeddings=True, torch_dtype="float32",
    )
    model = LlamaForCausalLM(config).to(torch.float32)
    model.save_pretrained(out, safe_serialization=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    build_tokenizer(args.out, args.vocab, args.seed)
    build_model(args.out, args.vocab, args.seed)
    print(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
