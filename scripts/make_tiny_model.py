"""Build a tiny random-weight Llama and its tokenizer in a directory, with no hub download.

Usage: .venv-vllm/bin/python scripts/make_tiny_model.py OUT_DIR [--vocab 4096] [--seed 0]
       [--lora ADAPTER_DIR] [--reranker RERANKER_DIR]

Why: the real-vLLM tests need a model vLLM can load, on a CPU, in seconds, on machines that
reach no model hub. A 2-layer, 128-wide Llama with a 4,096-token byte-level BPE vocabulary
loads in a few seconds and prefills thousands of tokens per second on one core; its outputs
are noise, which is fine: the tests measure the prefix cache, not the text.
The tokenizer is trained here on deterministic pseudo-text so the directory is identical
from run to run (same seed, same files), and is byte-level so any prompt text tokenizes.
Needs torch, transformers and tokenizers (the vLLM environment has them).

In the same run (one interpreter start, the tokenizer trained once), for the API tests:
- ``--lora DIR``: a rank-8 LoRA adapter of the model on q/k/v/o, written by peft as a
  fine-tuning run writes it (adapter_config.json, adapter_model.safetensors), so vLLM's
  ``--lora-modules`` reads what it reads in production; ``init_lora_weights=False`` makes B
  random as well as A, so the adapter changes the outputs as a trained one does (peft's
  default B = 0 would not). Needs peft (the Makefile installs it in .venv-vllm).
- ``--reranker DIR``: the same body as a LlamaForSequenceClassification with one label, with
  the tokenizer. vLLM 0.32 resolves that architecture to ``--runner pooling --convert
  classify`` (its ``*ForSequenceClassification`` suffix default) and, with num_labels 1,
  serves it as a cross-encoder: ``/rerank``, ``/v1/rerank``, ``/v2/rerank``, ``/score``,
  ``/v1/score``, as it serves a real reranker such as bge-reranker or Qwen3-Reranker.
"""

from __future__ import annotations

import argparse
import random
import shutil
from collections.abc import Iterator
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
SPECIAL = ["<s>", "</s>", "<unk>", "<pad>"]
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "chat_template.jinja")


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


def llama_config(vocab_size: int, **extra: object):  # -> LlamaConfig (imported late)
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        max_position_embeddings=8192, bos_token_id=0, eos_token_id=1, pad_token_id=3,
        tie_word_embeddings=True, torch_dtype="float32", **extra,
    )


def build_model(out: Path, vocab_size: int, seed: int):  # -> LlamaForCausalLM
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(llama_config(vocab_size)).to(torch.float32)
    model.save_pretrained(out, safe_serialization=True)
    return model


def build_lora(model, out: Path, seed: int, rank: int = 8) -> None:
    import torch
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed + 1)
    config = LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0, bias="none",
                        target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                        init_lora_weights=False, task_type="CAUSAL_LM")
    get_peft_model(model, config).save_pretrained(out, safe_serialization=True)


def build_reranker(out: Path, vocab_size: int, seed: int) -> None:
    import torch
    from transformers import LlamaForSequenceClassification

    torch.manual_seed(seed + 2)
    config = llama_config(vocab_size, num_labels=1)  # one relevance score per pair
    LlamaForSequenceClassification(config).to(torch.float32).save_pretrained(
        out, safe_serialization=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lora", type=Path, help="also write a LoRA adapter of it here")
    parser.add_argument("--reranker", type=Path, help="also write a one-label reranker here")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    build_tokenizer(args.out, args.vocab, args.seed)
    model = build_model(args.out, args.vocab, args.seed)
    if args.lora is not None:
        args.lora.mkdir(parents=True, exist_ok=True)
        build_lora(model, args.lora, args.seed)
    if args.reranker is not None:
        args.reranker.mkdir(parents=True, exist_ok=True)
        for name in TOKENIZER_FILES:  # the same tokenizer, trained once
            if (args.out / name).exists():
                shutil.copy(args.out / name, args.reranker / name)
        build_reranker(args.reranker, args.vocab, args.seed)
    print(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
