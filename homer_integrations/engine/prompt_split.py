"""Finding the long document inside a chat prompt, and answering the prompt through HOMER.

Framework adapters (LangChain, LlamaIndex) receive whole prompts: a list of chat messages, one
of which may hold a document far longer than the model's window. ``split_prompt`` finds that
document and returns the texts the engine needs; ``start_answer`` runs them.

How the document is found, first rule that applies wins:

1. **explicit**: a document passed by the caller (``document=``). If its text occurs in a
   message it is cut out there; otherwise it is put at the start of the first user message.
2. **known**: the exact text of a document this engine compressed recently (a small per-engine
   registry, see ``remember_document``) occurs in a message, and the rest of that message is
   short (at most ``long_prompt_tokens``). This keeps every later call of a chain on the same
   cache, whatever its question.
3. **heuristic**: the rendered prompt is longer than ``long_prompt_tokens`` (default:
   ``long_prompt_default``, 1,024 tokens or the engine's ``max_chunk_len`` if smaller: a document kept
   whole, ``mode="auto"``, then answers every later call of the chain from its cache). In the
   longest message, the document is everything between the first and the last paragraph break
   (a blank line); the first paragraph is taken as instructions (head) and the last as the
   question (tail). Both must be short (at most half of ``long_prompt_tokens`` each); where one
   is not, that end tries a line break and then a sentence end instead. The cut points do not depend
   on the question as long as the question holds no blank line, so every question of an
   unchanged "stuff" chain (LangChain joins documents with blank lines) finds the same span.
4. Otherwise the prompt is **plain**: rendered and run as is.

The message holding the document is rewritten as ``<document>`` + the remaining text of the
message (head and tail, joined by a blank line). The whole message list is then
rendered with the chat template and split at the document: ``prefix`` (template head, system
message, earlier turns) + document + the engine's fixed ``document_suffix`` is compressed once
and cached; ``continuation`` (the head and tail of that message, and every later turn) is fed
after the cache. So the instructions around the document and any conversation history after
it never change the cache key, and the same document text shares one cache across templates,
questions and the explicit path.

The split depends on the HOMER mode of the call (``split_prompt(..., mode=)``, default the
engine's configured mode), which the ``PromptSplit`` records and ``start_answer`` runs:
``shared`` and ``full`` split as above (``full`` keeps that span uncompressed); ``query_aware``
moves the question into the compressed suffix (``homer.document.prompt.layout_around``, which the
engine's own questions are cut by too).
"""

from __future__ import annotations

import re
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from homer_integrations.engine.modes import KEPT_FORMS
from homer_integrations.engine.prompting import check_text
from homer_integrations.homer.config import Mode
from homer_integrations.homer.document.prompt import DOCUMENT_MARK, PromptText, concat, markup

if TYPE_CHECKING:
    from homer_integrations.engine.model import AnswerStream, HomerModel
    from homer_integrations.homer.decoding.generation import GenerationOptions

FoundBy = Literal["explicit", "known", "heuristic", "plain"]
Message = Mapping[str, str]
Renderer = Callable[[list[dict[str, str]]], str]

KNOWN_DOCUMENTS_PER_ENGINE = 16
MIN_KNOWN_CHARS = 256
"""Shorter texts are not matched as known documents: they would match ordinary prompts."""

_EMPTY = PromptText()
_BREAKS = (
    re.compile(r"\n[ \t]*\n\s*"),  # paragraphs (LangChain's stuff chains join documents with "\n\n")
    re.compile(r"\n\s*"),  # lines
    re.compile(r"(?<=[.!?])\s+"),  # sentences
)


@dataclass(frozen=True)
class PromptSplit:
    """A prompt, and where its document is.

    ``prefix + document + suffix`` is compressed and ``continuation`` fed after it; ``found_by``
    says which rule found the document (``plain`` when there is none, and ``plain_prompt`` is the
    rendered prompt to run as is); ``mode`` is the HOMER mode the texts were split for and the
    document is answered in (None when plain). The texts are ``PromptText``: only the template's
    markup becomes control tokens, never the document or a message's content.
    """

    document: str | None = None
    prefix: PromptText = _EMPTY
    suffix: PromptText = _EMPTY
    continuation: PromptText = _EMPTY
    found_by: FoundBy = "plain"
    mode: Mode | None = None
    plain_prompt: str = ""

    @property
    def prompt(self) -> str:
        """The whole prompt (joined only when read: answering uses the spans)."""
        if self.document is None:
            return self.plain_prompt
        return concat(self.prefix, self.document, self.suffix, self.continuation)


def render_plain_text(messages: list[dict[str, str]]) -> str:
    """A renderer for prompts that are already formatted text: the messages' contents, concatenated.

    The result is a plain ``str``, which counts as formatted: control tokens it spells are real
    (only a document found in it is always plain text).
    """
    return "".join(m["content"] for m in messages)


# ------------------------------------------------------------------------------------- registry
class _KnownDocuments:
    """Recently compressed document texts of one engine, most recent first."""

    def __init__(self) -> None:
        self._texts: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()

    def add(self, text: str) -> None:
        with self._lock:
            self._texts[text] = None
            self._texts.move_to_end(text, last=False)
            while len(self._texts) > KNOWN_DOCUMENTS_PER_ENGINE:
                self._texts.popitem(last=True)

    def snapshot(self) -> list[str]:
        with self._lock:
            return list(self._texts)


_registry: weakref.WeakKeyDictionary[HomerModel, _KnownDocuments] = weakref.WeakKeyDictionary()
_registry_lock = threading.Lock()


def _known(engine: HomerModel) -> _KnownDocuments:
    with _registry_lock:
        found = _registry.get(engine)
        if found is None:
            found = _registry[engine] = _KnownDocuments()
        return found


def remember_document(engine: HomerModel, text: str) -> None:
    """Record ``text`` as a document ``engine`` has compressed, so prompts that contain it find it."""
    if len(text) >= MIN_KNOWN_CHARS:
        _known(engine).add(text)


def known_documents(engine: HomerModel) -> list[str]:
    """The document texts ``engine`` compressed recently, most recent first."""
    return _known(engine).snapshot()


# ------------------------------------------------------------------------------------- splitting
LONG_PROMPT_TOKENS = 1024
"""Prompts longer than this (or the engine's ``max_chunk_len``, if smaller) are searched for a document."""


def long_prompt_default(engine: HomerModel) -> int:
    """Tokens past which a prompt is searched for a document: ``LONG_PROMPT_TOKENS`` or the engine's
    ``max_chunk_len``, the smaller. A prompt of a few thousand tokens run plainly is prefilled again on every
    call; found, its document is kept (whole where it fits the window) and read by every later call."""
    return min(LONG_PROMPT_TOKENS, engine.config.max_chunk_len)


def split_prompt(
    engine: HomerModel,
    messages: Sequence[Message],
    *,
    document: str | None = None,
    render: Renderer | None = None,
    long_prompt_tokens: int | None = None,
    mode: Mode | None = None,
) -> PromptSplit:
    """Find the long document in ``messages`` (``role``/``content`` dicts) for ``engine``.

    Args:
        document: an explicit document; wins over everything else.
        render: messages -> prompt text; default ``engine.chat_prompt`` (the chat template, whose
            ``PromptText`` keeps message contents plain). Use ``render_plain_text`` for a prompt that
            is already formatted; a renderer's plain ``str`` counts as formatted markup.
        long_prompt_tokens: prompts up to this many tokens with no known document run plainly;
            default ``long_prompt_default(engine)``.
        mode: the HOMER mode of this call (``shared``, ``query_aware``, ``full``); None: the
            engine's configured mode. An unknown mode is a ``ValueError``.
    """
    mode = engine.mode_for(mode)
    msgs = [{"role": m["role"], "content": m["content"]} for m in messages]
    if not msgs:
        raise ValueError("no messages to answer")
    for m in msgs:
        if isinstance(m["content"], str):
            check_text(m["content"], "prompt")  # a lone surrogate reached the tokenizer's TypeError
    render = render or engine.chat_prompt
    if document is not None:
        check_text(document, "document")
        if not document.strip():
            raise ValueError("the explicit document is empty")
        where = _locate(msgs, [document, document.strip()])
        if where is None:
            index = next((i for i, m in enumerate(msgs) if m["role"] == "user"), len(msgs) - 1)
            return _split_at(engine, msgs, render, index, 0, 0, document, "explicit", mode)
        index, start, end = where
        explicit = msgs[index]["content"][start:end]
        return _split_at(engine, msgs, render, index, start, end, explicit, "explicit", mode)

    limit = long_prompt_tokens or long_prompt_default(engine)
    where = _locate(msgs, known_documents(engine))
    if where is not None:
        index, start, end = where
        content = msgs[index]["content"]
        # a known text inside a larger long context would leave that context to the continuation
        if engine.count_tokens(content[:start] + content[end:]) <= limit:
            return _split_at(engine, msgs, render, index, start, end, content[start:end], "known", mode)

    prompt = render(msgs)
    if not _longer_than(engine, prompt, limit):
        return PromptSplit(plain_prompt=prompt)
    index = max(range(len(msgs)), key=lambda i: len(msgs[i]["content"]))
    content = msgs[index]["content"]
    span = find_document_span(content, lambda text: engine.count_tokens(text) <= limit // 2)
    if span is None:
        return PromptSplit(plain_prompt=prompt)
    start, end = span
    return _split_at(engine, msgs, render, index, start, end, content[start:end], "heuristic", mode)


def _longer_than(engine: HomerModel, text: str, limit: int) -> bool:
    """Whether ``text`` has more than ``limit`` tokens, tokenizing only as much of it as that takes.

    A long document is tokenized once, when it is compressed, not here too: the text is counted in
    growing heads cut before a space (where byte-level and sentencepiece tokenizers split words
    alike), and a head over the limit decides.
    """
    size = 8 * limit
    while size < len(text):
        cut = text.rfind(" ", 0, size)
        if cut > 0:
            head = text.head(cut) if isinstance(text, PromptText) else text[:cut]
            if engine.count_tokens(head) > limit:
                return True
        size *= 4
    return engine.count_tokens(text) > limit


def find_document_span(text: str, is_short: Callable[[str], bool]) -> tuple[int, int] | None:
    """(start, end) of the document in ``text``: after its first break and before its last.

    Each end takes the coarsest break (paragraph, then line, then sentence end) that leaves a
    short head or tail (``is_short`` decides); None when either end finds none, or nothing
    is left between them.
    """
    start = end = None
    for pattern in _BREAKS:
        breaks = list(pattern.finditer(text))
        if start is None and breaks and is_short(text[: breaks[0].start()]):
            start = breaks[0].end()
        if end is None and breaks and is_short(text[breaks[-1].end() :]):
            end = breaks[-1].start()
    if start is None or end is None:
        return None
    end = start + len(text[start:end].rstrip())
    return (start, end) if start < end else None


def _locate(msgs: list[dict[str, str]], texts: Iterable[str]) -> tuple[int, int, int] | None:
    """(message index, start, end) of the first of ``texts`` found in a message."""
    for text in texts:
        if not text:
            continue
        for i, m in enumerate(msgs):
            start = m["content"].find(text)
            if start >= 0:
                return i, start, start + len(text)
    return None


def _remaining(head: str, tail: str) -> str:
    """The message's text without its document, as fed after the cache."""
    return "\n\n".join(part for part in (head.strip(), tail.strip()) if part)


def _split_at(
    engine: HomerModel,
    msgs: list[dict[str, str]],
    render: Renderer,
    index: int,
    start: int,
    end: int,
    document: str,
    found_by: FoundBy,
    mode: Mode,
) -> PromptSplit:
    """The split with ``document`` cut out of message ``index`` at ``start:end``, laid out for ``mode``
    (``auto`` decided for ``document``)."""
    mode = engine.mode_for(mode, document=document)
    content = msgs[index]["content"]
    rest = _remaining(content[:start], content[end:])
    rewritten = [dict(m) for m in msgs]
    rewritten[index]["content"] = DOCUMENT_MARK + rest
    spans = engine.layout_prompt(markup(render(rewritten)), rest, mode)
    return PromptSplit(document, spans.prefix, spans.suffix, spans.continuation, found_by, mode)


# ------------------------------------------------------------------------------------- answering
def start_answer(engine: HomerModel, split: PromptSplit, options: GenerationOptions) -> AnswerStream:
    """Answer a split prompt in the mode it was split for (``HomerModel.run_span``), or run it
    plainly when it has no document (``info.mode`` stays None then)."""
    if split.document is None:
        return engine.generate(split.plain_prompt, **options.model_dump())
    mode = engine.mode_for(split.mode)
    question = split.suffix if KEPT_FORMS[mode].asks else None
    stream = engine.run_span(
        split.prefix, split.document, split.suffix, split.continuation, options, question=question, mode=mode
    )
    remember_document(engine, split.document)
    return stream
