"""A request's prompt token ids, computed the way vLLM computes them.

Why the same way matters: a block hash covers exact token ids, so one token of difference
(a BOS, a template newline) shifts every block and precise matching finds nothing.
vLLM 0.32 renders chat requests with the tokenizer's chat template and
``add_generation_prompt=True`` (string content: text parts joined by newlines) and encodes
the result without adding special tokens again, which is what
``apply_chat_template(tokenize=True)`` does; completions encode the prompt text with the
tokenizer's special tokens, or take the given token ids as they are.

Tokenizing is CPU work (~30 ms for 12 k tokens on this 2-core machine). The matcher calls
``token_ids`` in a worker thread (HF fast tokenizers release the GIL in Rust), so the event
loop keeps serving other requests meanwhile.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from router.routing.keys import InvalidPrompt


def _message_content(content: Any) -> Any:
    """OpenAI content parts -> the string a "string"-format chat template expects."""
    if isinstance(content, list):
        texts = [p.get("text", "") for p in content if isinstance(p, dict)
                 and p.get("type", "text") == "text"]
        return "\n".join(t for t in texts if isinstance(t, str))
    return content


class PromptTokenizer:
    """One model's Hugging Face tokenizer, loaded from a local directory (no hub access)."""

    def __init__(self, path: str) -> None:
        from transformers import AutoTokenizer  # optional dependency: the `precise` extra

        self.path = path
        self._tok = AutoTokenizer.from_pretrained(path, local_files_only=True)

    def chat_ids(self, body: Mapping[str, Any]) -> list[int]:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise InvalidPrompt("'messages' must be a non-empty array")
        rendered = [{**m, "content": _message_content(m.get("content"))}
                    if isinstance(m, dict) else m for m in messages]
        kwargs: dict[str, Any] = dict(body.get("chat_template_kwargs") or {})
        if body.get("tools"):
            kwargs["tools"] = body["tools"]
        out = self._tok.apply_chat_template(rendered, tokenize=True,
                                            add_generation_prompt=True, **kwargs)
        ids = out["input_ids"] if hasattr(out, "keys") else out  # transformers 5: a dict
        return list(ids)

    def completion_ids(self, body: Mapping[str, Any]) -> list[int]:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
            prompt = prompt[0]  # a batch (of strings or of id arrays) routes on its first
        if isinstance(prompt, str):
            return list(self._tok(prompt)["input_ids"])
        if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            return list(prompt)
        raise InvalidPrompt("'prompt' must be a string, an array of strings or of token ids")

    def token_ids(self, body: Mapping[str, Any], chat: bool) -> list[int]:
        return self.chat_ids(body) if chat else self.completion_ids(body)


def load_tokenizers(spec: Sequence[tuple[str, str]]) -> dict[str, PromptTokenizer]:
    """(model, directory) pairs -> tokenizers; fails at start naming a model that won't load."""
    out: dict[str, PromptTokenizer] = {}
    for model, path in spec:
        try:
            out[model] = PromptTokenizer(path)
        except ImportError as exc:
            raise SystemExit("precise mode (--tokenizers) needs the 'precise' extra: "
                             "pip install 'prefix-router[precise]'") from exc
        except (OSError, ValueError) as exc:
            raise SystemExit(f"cannot load the tokenizer of {model!r} from {path}: {exc}") from exc
    return out
