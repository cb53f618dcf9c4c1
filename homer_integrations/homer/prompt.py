"""How a (document, question) pair becomes prefix / document / suffix / continuation token spans.

The chat template is rendered once with sentinel strings in place of the document and the
question, and the rendered text is split at the sentinels, so every chat format (ChatML,
Llama, Mistral) is handled by the tokenizer's own template.

- ``shared`` mode: suffix = the fixed ``document_suffix`` (question-independent, so the
  compressed cache serves every question); continuation = the question and the assistant head.
- ``query_aware`` mode: suffix = ``document_suffix`` + question + assistant head (the paper);
  continuation is empty and the answer starts from the compression's last logits. With
  ``reask``: suffix = ``document_suffix`` + question, and the continuation is as in ``shared``
  mode (the question is asked again after the cache).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import PreTrainedTokenizerBase

from homer_integrations.homer.config import PoolUnit

_DOC = "\u2063HOMERDOC\u2063"
_QUESTION = "\u2063HOMERQ\u2063"


@dataclass(frozen=True)
class PromptTexts:
    """The text spans around the document: ``prefix`` + document + ``suffix`` is compressed,
    ``continuation`` is fed after the compressed cache."""

    prefix: str
    suffix: str
    continuation: str


def render_layout(
    tokenizer: PreTrainedTokenizerBase,
    question: str,
    document_suffix: str,
    query_aware: bool,
    system_prompt: str | None = None,
    reask: bool = False,
) -> PromptTexts:
    """Split the chat-formatted prompt around the document for the chosen mode."""
    user = f"{_DOC}{document_suffix}{_QUESTION}"
    if tokenizer.chat_template:
        messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
        messages.append({"role": "user", "content": user})
        rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    else:
        head = f"{system_prompt}\n\n" if system_prompt else ""
        rendered = f"{head}{user}\nAnswer:"
    prefix, rest = rendered.split(_DOC, 1)
    middle, tail = rest.split(_QUESTION, 1)
    if query_aware and reask:
        return PromptTexts(prefix=prefix, suffix=f"{middle}{question}\n\n", continuation=question + tail)
    if query_aware:
        return PromptTexts(prefix=prefix, suffix=middle + question + tail, continuation="")
    return PromptTexts(prefix=prefix, suffix=middle, continuation=question + tail)


def encode(tokenizer: PreTrainedTokenizerBase, text: str, first: bool = False) -> torch.Tensor:
    """Token ids [n] of ``text``. Special tokens are added only to the very first span, and only
    when the text does not already start with them (chat templates render BOS themselves)."""
    add = first and not (tokenizer.bos_token and text.startswith(tokenizer.bos_token))
    ids = tokenizer(text, add_special_tokens=add)["input_ids"] if text else []
    return torch.tensor(ids, dtype=torch.long)


_SENTENCE_END = ".!?;:\n"


def unit_ids(tokenizer: PreTrainedTokenizerBase, text: str, unit: PoolUnit) -> torch.Tensor | None:
    """Unit index [n] of every token of ``text``: tokens of one word (no whitespace between them) or
    one sentence (up to ``.!?;:`` or a line break) share an index. None for ``token``.

    Returns None as well when the tokenizer's offsets do not line up with ``encode`` (then
    pruning falls back to single tokens).
    """
    if unit == "token":
        return None
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, index, prev_end, closed = [], -1, None, True
    for start, end in enc["offset_mapping"]:
        starts_word = (
            prev_end is None
            or start > prev_end
            or (start < len(text) and text[start].isspace())
            or (start > 0 and text[start - 1].isspace())
        )
        if starts_word and (unit == "word" or closed):
            index += 1
        ids.append(index)
        piece = text[start:end].rstrip(" \t")
        closed = bool(piece) and (piece[-1] in _SENTENCE_END or "\n" in text[start:end])
        prev_end = end
    return torch.tensor(ids, dtype=torch.long)
