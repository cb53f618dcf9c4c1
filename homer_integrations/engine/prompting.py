"""``Prompting``: the tokenizer side of an engine. It counts, renders and bounds the texts around
a document for one model and one ``HomerConfig``; the framework adapters measure and split
prompts with it. ``DocumentTokens``: what it remembers of the documents it tokenized."""

from __future__ import annotations

import functools
import logging
import re

import torch
from transformers import PreTrainedTokenizerBase

from homer_integrations.homer.config import HomerConfig, Mode, resolve_mode
from homer_integrations.homer.document.encoded import EncodedDocument
from homer_integrations.homer.document.prompt import (
    PromptText,
    PromptTexts,
    encode,
    encode_offsets,
    layout_around,
    render_chat,
    render_layout,
)

logger = logging.getLogger(__name__)

DOCUMENTS_REMEMBERED = 4
"""Documents whose token ids and offsets ``Prompting`` keeps (16 bytes a token: 1 MB for a 64k-token document)."""
DEFAULT_MAX_DOCUMENT_TOKENS = 2_000_000
"""Most document tokens an engine takes by default (``HomerModel(max_document_tokens=)``): a 500k-token
book passes; a 50 MB text (about 12M tokens) is refused after counting its first ~8 MB."""
COUNT_SLICE_CHARS = 1 << 18
"""Characters tokenized at a time while a long document's tokens are counted against the limit: the
tokenizer's working memory stays ~10 MB however long the text (1M characters at once took ~130 MB)."""
WHOLE_PROMPT_ROOM = 1024
"""Tokens of the window ``mode="auto"`` leaves free beside a document kept whole: a question and its answer
run at positions after the document's, and none should pass the window the model was trained for."""
QUESTION_SHARE = 4
"""A question may take at most ``max_chunk_len // QUESTION_SHARE`` tokens: it enters every leaf's suffix
in query-aware mode and is prefilled after the cache in the others, and must leave the chunk room for
the document."""
_SURROGATE = re.compile("[\ud800-\udfff]")
_NOT_SPACE = re.compile(r"\S")


def check_text(text: object, what: str) -> None:
    """Raise ``TypeError`` unless ``text`` is a ``str``, ``ValueError`` if it holds a lone surrogate
    (what ``errors="surrogateescape"`` makes of bytes that are not UTF-8): no tokenizer takes it.
    ``what`` names it in the message ("document", "question")."""
    if not isinstance(text, str):
        hint = ": decode it first" if isinstance(text, bytes | bytearray | memoryview) else ""
        raise TypeError(f"the {what} must be text (str), not {type(text).__name__}{hint}")
    bad = _SURROGATE.search(text)
    if bad is not None:
        raise ValueError(
            f"the {what} is not valid Unicode text: a lone surrogate U+{ord(bad.group()):04X} at character "
            f"{bad.start():,} (bytes decoded with errors='surrogateescape'? decode them with errors='replace')"
        )


class PromptTooLongError(ValueError):
    """The prompt around the document (system prompt, instructions, question, template), which is never
    pruned, leaves the compressed cache no room for the document within ``final_cache_len``."""


class InputTooLongError(ValueError):
    """A document or question longer than the engine takes, refused before it is compressed.

    ``setting`` names what raises the limit (``max_document_tokens``, ``max_chunk_len``); the message
    says so as a Python argument, ``worded(option)`` as a command-line option instead.
    """

    def __init__(self, message: str, setting: str) -> None:
        self.message, self.setting = message, setting
        super().__init__(self.worded(f"{setting}="))

    def worded(self, option: str) -> str:
        """The message with ``option`` (``--max-chunk-len N``) as what raises the limit."""
        return self.message.format(option=option)


class Prompting:
    """Token counts, prompt layouts and size limits for ``tokenizer`` under ``config`` (resolved).

    ``num_layers`` bounds the merge tree's height; ``context_window`` is the model's window;
    ``max_document_tokens`` (None: only the merge tree's bound) is the most document tokens taken;
    ``reask_question``: a ``query_aware`` layout asks the question again after the cache
    (``Recipe.reask_question``).
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        config: HomerConfig,
        num_layers: int,
        context_window: int,
        max_document_tokens: int | None = DEFAULT_MAX_DOCUMENT_TOKENS,
        *,
        reask_question: bool = True,
    ) -> None:
        if max_document_tokens is not None and (type(max_document_tokens) is not int or max_document_tokens < 1):
            raise ValueError(f"max_document_tokens must be a whole number >= 1 or None, not {max_document_tokens!r}")
        self.tokenizer = tokenizer
        self.config = config
        self.reask_question = reask_question
        self.num_layers = num_layers
        self.context_window = context_window
        self.document_limit = max_document_tokens
        """Most document tokens taken (``DEFAULT_MAX_DOCUMENT_TOKENS``); None: the merge tree's bound only."""
        self.documents = DocumentTokens(tokenizer)
        """The last documents' ids and offsets, and long ones' counts."""

    def count_tokens(self, text: str) -> int:
        """Tokens of ``text`` as plain text (a ``PromptText`` keeps its markup's control tokens)."""
        return len(self.token_ids(text))

    def token_ids(self, text: str) -> list[int]:
        """Token ids of ``text`` as plain text (a ``PromptText`` keeps its markup's control tokens)."""
        return encode(self.tokenizer, text).tolist()

    def chat_prompt(self, messages: list[dict[str, str]]) -> PromptText:
        """Render chat messages with the tokenizer's template (plain 'role: content' lines without one).

        The contents stay plain text: a message that spells a control token does not become one.
        """
        return render_chat(self.tokenizer, messages)

    def whole_mode(self, document: str) -> Mode:
        """What ``mode="auto"`` means for ``document``: ``full`` when its whole prompt leaves
        ``WHOLE_PROMPT_ROOM`` tokens of the window for a question and its answer, else ``query_aware``.
        A long document is counted only until it passes that (``DocumentTokens.count``)."""
        room = self.context_window - WHOLE_PROMPT_ROOM - self.affix_tokens
        try:
            check_text(document, "document")
        except (TypeError, ValueError):
            return "query_aware"  # where the text is checked and refused in its own words
        if room <= 0 or not document:
            return "query_aware"
        counted, _ = self.documents.count(document, room)
        return "full" if counted <= room else "query_aware"

    @functools.cached_property
    def affix_tokens(self) -> int:
        """Tokens of the ``full`` layout's prefix and suffix around a document (rendered once)."""
        layout = self.layout("", "full")
        return sum(encode(self.tokenizer, t, formatted=True).numel() for t in (layout.prefix, layout.suffix))

    def layout(self, question: str = "", mode: Mode | None = None) -> PromptTexts:
        """Prefix / suffix / continuation texts around the document for ``question`` in ``mode``
        (default: the configured one)."""
        c = self.config
        query_aware = resolve_mode(mode, default=c.mode) == "query_aware"
        return render_layout(
            self.tokenizer, question, c.document_suffix, query_aware, c.system_prompt, self.reask_question
        )

    def layout_prompt(self, rendered: PromptText, question: str, mode: Mode | None = None) -> PromptTexts:
        """Prefix / suffix / continuation texts of ``rendered``, a prompt rendered with ``DOCUMENT_MARK`` where
        the document goes; ``question`` is the rest of the document's message
        (``homer.document.prompt.layout_around``)."""
        query_aware = resolve_mode(mode, default=self.config.mode) == "query_aware"
        return layout_around(rendered, question, self.config.document_suffix, query_aware, self.reask_question)

    @functools.cached_property
    def shared_suffix_len(self) -> int:
        """Tokens of the shared layout's suffix (what a leaf tier's split is planned for; rendered once)."""
        return encode(self.tokenizer, self.layout("", "shared").suffix, formatted=True).numel()

    def tree_capacity(self, prefix_tokens: int = 0, suffix_tokens: int = 0) -> int:
        """Most document tokens the merge tree can hold: a tree of height h needs h + 1 layers, so at
        most ``2**(num_layers - 1)`` leaves of ``max_chunk_len - prefix_tokens - suffix_tokens`` tokens."""
        return max(0, self.config.max_chunk_len - prefix_tokens - suffix_tokens) * 2 ** (self.num_layers - 1)

    def max_document_tokens(self, prefix_tokens: int = 0, suffix_tokens: int = 0) -> int:
        """Most document tokens taken: the merge tree's capacity or ``document_limit``, the lower."""
        tree = self.tree_capacity(prefix_tokens, suffix_tokens)
        return tree if self.document_limit is None else min(tree, self.document_limit)

    @functools.cached_property
    def longest_token(self) -> int:
        """Characters of the vocabulary's longest entry: no token stands for more characters than its
        entry spells (byte-level and sentencepiece spellings are never shorter than their text)."""
        return max(1, max(map(len, self.tokenizer.get_vocab()), default=1))

    def surely_over(self, tokens: int) -> int:
        """Characters beyond which a text surely has more than ``tokens`` tokens: ``tokens * 4 *
        longest_token`` (the factor 4 leaves room for normalisers that compose characters)."""
        return tokens * 4 * self.longest_token

    @property
    def max_document_chars(self) -> int:
        """A document longer than this many characters surely has more tokens than the engine takes;
        it is refused before any of it is tokenized."""
        return self.surely_over(self.max_document_tokens())

    @property
    def max_question_tokens(self) -> int:
        """Most tokens a question may have: ``max_chunk_len // QUESTION_SHARE`` (see ``QUESTION_SHARE``)."""
        return self.config.max_chunk_len // QUESTION_SHARE

    def check_document(self, document: str) -> None:
        """Refuse what is not text (``check_text``), an empty document, or one with more tokens than the
        engine takes (``max_document_tokens``), before any of it is compressed.

        A document far longer in characters is refused untokenized; one over ``COUNT_SLICE_CHARS`` has
        its tokens counted slice by slice until the count passes the limit (bounded memory, and a
        50 MB text is refused after its first few MB); ``encode_span`` checks the exact count."""
        check_text(document, "document")
        if _NOT_SPACE.search(document) is None:
            raise ValueError("the document is empty")
        limit = self.max_document_tokens()
        if len(document) > self.max_document_chars:
            raise self._too_long(f"{len(document):,} characters, far more than", limit)
        if len(document) > COUNT_SLICE_CHARS:
            counted, read = self.documents.count(document, limit)
            if counted > limit:
                raise self._too_long(f"over {counted:,} tokens in its first {read:,} characters, more than", limit)

    def check_question(self, question: str, *, allow_empty: bool = False) -> None:
        """Refuse what is not text (``check_text``), an empty question (unless ``allow_empty``), or one over
        ``max_question_tokens`` (a question far longer in characters untokenized)."""
        check_text(question, "question")
        if not allow_empty and _NOT_SPACE.search(question) is None:
            raise ValueError("the question is empty")
        limit = self.max_question_tokens
        if len(question) > self.surely_over(limit):
            size = f"{len(question):,} characters, far more than"
        else:
            tokens = encode(self.tokenizer, question).numel()
            if tokens <= limit:
                return
            size = f"{tokens:,} tokens, more than"
        mcl = self.config.max_chunk_len
        raise InputTooLongError(
            f"the question has {size} the {limit:,} tokens a question may have (max_chunk_len={mcl} // "
            f"{QUESTION_SHARE}: it is read beside the document in every chunk); shorten it, put long context "
            f"into the document, or raise {{option}}",
            "max_chunk_len",
        )

    def _too_long(self, size: str, limit: int, prefix_tokens: int = 0, suffix_tokens: int = 0) -> InputTooLongError:
        """The refusal of a document of ``size`` ("N tokens, more than") over ``limit`` tokens, naming the
        setting that raises it: ``max_document_tokens``, or ``max_chunk_len`` where the merge tree binds."""
        if self.document_limit is not None and limit >= self.document_limit:
            return InputTooLongError(
                f"the document has {size} the {limit:,} tokens this engine takes (max_document_tokens="
                f"{self.document_limit:,}); split it, or raise {{option}}",
                "max_document_tokens",
            )
        return InputTooLongError(
            f"the document has {size} this model's merge tree can hold ({limit:,} tokens at max_chunk_len="
            f"{self.config.max_chunk_len} over {self.num_layers} layers); split it, or raise {{option}}",
            "max_chunk_len",
        )

    def encode_document(
        self, prefix: str, document: str, suffix: str, *, full: bool = False, asks: bool = False
    ) -> EncodedDocument:
        """The call's ``EncodedDocument`` of a document ``check_document`` takes (``encode_span``'s ids, the
        document's units on demand, from the offsets of the one tokenizer call that gave its ids); ``asks``:
        the suffix holds a question, which the document's limit does not count (the leaf tier the question
        replays from is planned without it)."""
        self.check_document(document)
        prefix_ids, document_ids, suffix_ids = self.encode_span(prefix, document, "" if asks else suffix, full=full)
        if asks:
            suffix_ids = encode(self.tokenizer, suffix, formatted=True)
        offsets = self.documents.ids(document)[1] if type(document) is str else None
        return EncodedDocument(document, prefix_ids, document_ids, suffix_ids, self.tokenizer, offsets)

    def encode_span(
        self, prefix: str, document: str, suffix: str, *, full: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Token ids ``[P]``, ``[N]``, ``[S]`` of the three spans; a document the merge tree (or, ``full``,
        the window) cannot hold is refused here, before calibration or any layer runs."""
        prefix_ids = encode(self.tokenizer, prefix, first=True, formatted=True)
        if type(document) is str:  # a PromptText's markup is not part of its str equality: not remembered
            document_ids = self.documents.ids(document)[0].clone()  # the remembered ids stay untouched
        else:
            document_ids = encode(self.tokenizer, document)
        suffix_ids = encode(self.tokenizer, suffix, formatted=True)
        prompt_len = prefix_ids.numel() + document_ids.numel() + suffix_ids.numel()
        if full and prompt_len >= self.context_window:
            raise ValueError(
                f"mode='full' keeps the whole prompt uncompressed, but it has {prompt_len:,} tokens, over the "
                f"model's {self.context_window:,}-token window; use mode='shared' or 'query_aware'"
            )
        if full:
            return prefix_ids, document_ids, suffix_ids
        limit = self.max_document_tokens(prefix_ids.numel(), suffix_ids.numel())
        if document_ids.numel() > limit:
            raise self._too_long(f"{document_ids.numel():,} tokens, more than", limit)
        return prefix_ids, document_ids, suffix_ids


class DocumentTokens:
    """What ``Prompting`` remembers of the last ``DOCUMENTS_REMEMBERED`` documents, keyed by their text:
    ``ids(document)``, its token ids [N] and character spans [N, 2] from one tokenizer call (no spans
    from a slow tokenizer), and ``count(document, limit)``, a long one's count against a limit."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer
        # A document's ids are asked for again by every question on it (the tier's build, each replay's
        # re-read): tokenizing 32k tokens costs ~0.1 s, a fifth of a GPU question. Keyed by the text
        # itself; a str caches its hash, so a hit on the caller's own string object costs nothing.
        self.ids = functools.lru_cache(maxsize=DOCUMENTS_REMEMBERED)(self._tokenize)
        # a long document checked up front (the CLI does) is not counted again when it is compressed
        self.count = functools.lru_cache(maxsize=DOCUMENTS_REMEMBERED)(self._count_until)

    def _tokenize(self, document: str) -> tuple[torch.Tensor, torch.Tensor | None]:
        if not self.tokenizer.is_fast:
            return encode(self.tokenizer, document), None
        return encode_offsets(self.tokenizer, document)

    def _count_until(self, document: str, limit: int) -> tuple[int, int]:
        """(tokens counted, characters read): ``document``'s tokens counted ``COUNT_SLICE_CHARS`` at a
        time (each slice ends after a space where one is near), stopping once the count passes ``limit``."""
        counted = start = 0
        while start < len(document) and counted <= limit:
            end = min(len(document), start + COUNT_SLICE_CHARS)
            if end < len(document):
                space = document.rfind(" ", start + COUNT_SLICE_CHARS // 2, end)
                end = space + 1 if space >= 0 else end
            counted += encode(self.tokenizer, document[start:end]).numel()
            start = end
        return counted, start
