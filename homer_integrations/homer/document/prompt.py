"""How a (document, question) pair becomes prefix / document / suffix / continuation token spans.

The chat template is rendered once with a mark in place of the document (``DOCUMENT_MARK``), and
the rendered text is cut there (``layout_around``, the one layout builder), so every chat format
(ChatML, Llama, Mistral) is handled by the tokenizer's own template.

- ``shared`` mode: suffix = the fixed ``document_suffix`` (question-independent, so the
  compressed cache serves every question); continuation = the question and the assistant head.
- ``query_aware`` mode: suffix = ``document_suffix`` + question + assistant head (the paper);
  continuation is empty and the answer starts from the compression's last logits. With
  ``reask``: suffix = ``document_suffix`` + question, and the continuation is as in ``shared``
  mode (the question is asked again after the cache).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import torch
from transformers import PreTrainedTokenizerBase

DOCUMENT_MARK = "\u2063HOMERDOC\u2063"
"""Stands where the document goes in a rendered prompt, for ``layout_around`` to cut at."""
_CONTENT = "\u2063HOMERMSG{}\u2063"
_CONTENT_RE = re.compile("\u2063HOMERMSG(\\d+)\u2063")
# fast tokenizers keep ``split_special_tokens`` as a flag on the shared backend, set per call:
# calls with different flags must not interleave
_TOKENIZE_LOCK = threading.Lock()

Segment = tuple[str, bool]
"""A piece of prompt text and whether it is chat-template markup."""


class PromptText(str):
    """Prompt text that knows which of its characters are chat-template markup.

    Only markup may spell control tokens (``<|im_start|>``, ``<|im_end|>``, ...): ``encode`` turns
    them into the real special tokens there and nowhere else, so a document, question or message
    that spells one stays plain text (no prompt injection). Compares, hashes and prints as the plain
    string; ``segments`` is the canonical (text, is_markup) split (no empty pieces, neighbours of one
    kind joined). Build it with ``markup``, ``plain`` and ``concat``, and cut it with ``partition``:
    ordinary ``str`` operations return a plain ``str`` that no longer knows its markup.
    """

    segments: tuple[Segment, ...]

    def __new__(cls, segments: Iterable[Segment] = ()) -> PromptText:
        merged: list[Segment] = []
        for text, is_markup in segments:
            if not text:
                continue
            if merged and merged[-1][1] == is_markup:
                merged[-1] = (merged[-1][0] + text, is_markup)
            else:
                merged.append((text, bool(is_markup)))
        self = super().__new__(cls, "".join(text for text, _ in merged))
        self.segments = tuple(merged)
        return self

    def __getnewargs__(self) -> tuple[tuple[Segment, ...]]:  # type: ignore[override]
        return (self.segments,)

    def content(self) -> str:
        """The text that is not markup (the messages' words), joined."""
        return "".join(text for text, is_markup in self.segments if not is_markup)

    def head(self, n: int) -> PromptText:
        """The first ``n`` characters, keeping the markup."""
        kept: list[Segment] = []
        for text, is_markup in self.segments:
            if n <= 0:
                break
            kept.append((text[:n], is_markup))
            n -= len(text)
        return PromptText(kept)

    def partition(self, sep: str) -> tuple[PromptText, PromptText, PromptText]:  # type: ignore[override]
        """Like ``str.partition``, keeping the markup; ``sep`` must lie within one segment."""
        head: list[Segment] = []
        for i, (text, is_markup) in enumerate(self.segments):
            before, found, after = text.partition(sep)
            if found:
                rest = [(after, is_markup), *self.segments[i + 1 :]]
                return PromptText([*head, (before, is_markup)]), PromptText([(sep, is_markup)]), PromptText(rest)
            head.append((text, is_markup))
        return self, PromptText(), PromptText()


def markup(text: str) -> PromptText:
    """``text`` as chat-template markup: the control tokens it spells are real."""
    return text if isinstance(text, PromptText) else PromptText([(text, True)])


def plain(text: str) -> PromptText:
    """``text`` as content (a document, a question, a message): never a control token."""
    return PromptText([(text, False)])


def concat(*parts: str) -> PromptText:
    """Join prompt texts; a part that is a plain ``str`` (not a ``PromptText``) counts as content."""
    return PromptText(
        seg for part in parts for seg in (part.segments if isinstance(part, PromptText) else [(part, False)])
    )


def render_chat(
    tokenizer: PreTrainedTokenizerBase, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = True
) -> PromptText:
    """Messages rendered with the tokenizer's chat template: the template's output is markup, every
    message's content is plain. Without a template: ``role: content`` lines and ``assistant:``.

    The template is rendered with a sentinel in place of each content; a template that trims
    contents (Llama 3) gets them trimmed, any other change a template makes to contents is not applied.
    """
    if not tokenizer.chat_template:
        lines = [concat(markup(f"{m['role']}: "), m["content"], markup("\n")) for m in messages]
        return concat(*lines, markup("assistant:" if add_generation_prompt else ""))
    stand_ins = [{**m, "content": _CONTENT.format(i)} for i, m in enumerate(messages)]
    rendered = tokenizer.apply_chat_template(stand_ins, tokenize=False, add_generation_prompt=add_generation_prompt)
    real = tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=add_generation_prompt)
    for transform in (lambda text: text, str.strip):
        contents = [transform(m["content"]) for m in messages]
        text = _fill(rendered, contents)
        if text == real:
            return text
    return _fill(rendered, [m["content"] for m in messages])


def _fill(rendered: str, contents: list[str]) -> PromptText:
    """``rendered`` with each content sentinel replaced by its content (plain); the rest is markup."""
    parts = _CONTENT_RE.split(rendered)  # markup, index, markup, index, ...
    return PromptText((part, True) if i % 2 == 0 else (contents[int(part)], False) for i, part in enumerate(parts))


@dataclass(frozen=True)
class PromptTexts:
    """The text spans around the document: ``prefix`` + document + ``suffix`` is compressed,
    ``continuation`` is fed after the compressed cache. Each is a ``PromptText``: the chat
    template's markup keeps its control tokens, the question and system prompt are plain text."""

    prefix: PromptText
    suffix: PromptText
    continuation: PromptText


def layout_around(
    rendered: PromptText, question: str, document_suffix: str, query_aware: bool, reask: bool = False
) -> PromptTexts:
    """The spans around the document in ``rendered``, a prompt rendered with ``DOCUMENT_MARK``
    where the document goes; ``question`` is the rest of the document's message (what steers
    pruning in query-aware mode). The one layout builder: the engine's own questions and the
    prompts adapters find a document in are both cut here.

    - shared: prefix | document + ``document_suffix`` | everything after the mark;
    - query-aware with ``reask``: the question also ends the suffix, and is asked again after it;
    - query-aware: everything after the mark joins the suffix; nothing follows the cache.
    """
    prefix, _, continuation = rendered.partition(DOCUMENT_MARK)
    suffix = plain(document_suffix)
    if query_aware and reask:
        return PromptTexts(prefix, concat(suffix, question, "\n\n") if question else suffix, continuation)
    if query_aware:
        return PromptTexts(prefix, concat(suffix, continuation), PromptText())
    return PromptTexts(prefix, suffix, continuation)


def render_layout(
    tokenizer: PreTrainedTokenizerBase,
    question: str,
    document_suffix: str,
    query_aware: bool,
    system_prompt: str | None = None,
    reask: bool = False,
) -> PromptTexts:
    """The spans around the document for a user turn of the document followed by ``question``."""
    if tokenizer.chat_template:
        messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
        messages.append({"role": "user", "content": DOCUMENT_MARK + question})
        rendered = render_chat(tokenizer, messages)
    else:
        head = f"{system_prompt}\n\n" if system_prompt else ""
        rendered = concat(head, DOCUMENT_MARK + question, markup("\nAnswer:"))
    return layout_around(rendered, question, document_suffix, query_aware, reask)


def encode(
    tokenizer: PreTrainedTokenizerBase, text: str, first: bool = False, *, formatted: bool = False
) -> torch.Tensor:
    """Token ids [n] of ``text``, where only chat-template markup becomes special (control) tokens.

    That markup is the markup segments of a ``PromptText``, or all of a plain ``str`` passed with
    ``formatted=True`` (a prompt formatted by the caller); anything else (documents, questions,
    messages) is plain text even where it spells ``<|im_end|>``. Special tokens (BOS) are added only
    to the very first span, and only when the text does not already start with them (chat templates
    render BOS themselves).
    """
    add = first and not (tokenizer.bos_token and text.startswith(tokenizer.bos_token))
    if not isinstance(text, PromptText):
        return torch.tensor(_token_ids(tokenizer, text, add, split=not formatted), dtype=torch.long)
    ids = [i for i in _token_ids(tokenizer, "", True, split=True) if i == tokenizer.bos_token_id] if add else []
    for piece, is_special in _special_pieces(tokenizer, text):
        if is_special:
            ids.append(tokenizer.convert_tokens_to_ids(piece))
        else:
            ids.extend(_token_ids(tokenizer, piece, False, split=True))
    return torch.tensor(ids, dtype=torch.long)


def _token_ids(tokenizer: PreTrainedTokenizerBase, text: str, add: bool, *, split: bool) -> list[int]:
    """Token ids of ``text``; ``split``: a spelled special token is ordinary text."""
    if not text and not add:
        return []
    with _TOKENIZE_LOCK:
        return list(tokenizer(text, add_special_tokens=add, split_special_tokens=split)["input_ids"])


def _special_pieces(tokenizer: PreTrainedTokenizerBase, text: PromptText) -> list[tuple[str, bool]]:
    """``text`` as runs of ordinary text and single special tokens (found in markup only).

    Ordinary text runs across markup and content boundaries, so it tokenizes exactly as the whole
    rendered prompt would.
    """
    specials = sorted({t.content for t in tokenizer.added_tokens_decoder.values() if t.special}, key=len, reverse=True)
    pattern = re.compile("(" + "|".join(map(re.escape, specials)) + ")") if specials else None
    pieces: list[tuple[str, bool]] = []
    for segment, is_markup in text.segments:
        parts = pattern.split(segment) if is_markup and pattern else [segment]
        for i, part in enumerate(parts):
            if i % 2:
                pieces.append((part, True))
            elif part and pieces and not pieces[-1][1]:
                pieces[-1] = (pieces[-1][0] + part, False)
            elif part:
                pieces.append((part, False))
    return pieces


_UNIT_ENDS = {"sentence": ".!?;:", "statement": ".!?"}
"""What closes a unit besides a line break. A ``statement`` goes on past a colon or semicolon, so a
key and its value ("the number for X is: 8121922.") stay one unit."""


def unit_ids(tokenizer: PreTrainedTokenizerBase, text: str, unit: str) -> torch.Tensor | None:
    """Unit index [n] of every token of ``text`` (``units_at`` of its offsets); None for ``token``.

    Returns None as well when the tokenizer's offsets do not line up with ``encode`` (then
    pruning falls back to single tokens).
    """
    return None if unit == "token" else units_at(text, encode_offsets(tokenizer, text)[1], unit)


def encode_offsets(tokenizer: PreTrainedTokenizerBase, text: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids [n] of plain ``text`` (``encode``'s) and each token's character span [n, 2], from one
    tokenizer call (a fast tokenizer's: only those give offsets)."""
    with _TOKENIZE_LOCK:
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True, split_special_tokens=True)
    ids = torch.tensor(enc["input_ids"], dtype=torch.long)
    return ids, torch.tensor(enc["offset_mapping"], dtype=torch.int32).reshape(-1, 2)


def units_at(text: str, offsets: torch.Tensor, unit: str) -> torch.Tensor | None:
    """Unit index [n] of the tokens of ``text`` whose character spans are ``offsets`` [n, 2]: tokens of one
    word (no whitespace between them), one ``sentence`` (up to ``.!?;:`` or a line break) or one
    ``statement`` (up to ``.!?`` or a line break) share an index. None for ``token``."""
    if unit == "token":
        return None
    ends = _UNIT_ENDS.get(unit, "")
    ids, index, prev_end, closed = [], -1, None, True
    for start, end in offsets.tolist():
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
        closed = bool(piece) and (piece[-1] in ends or "\n" in text[start:end])
        prev_end = end
    return torch.tensor(ids, dtype=torch.long)
