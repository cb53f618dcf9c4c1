"""``Prompting``: the tokenizer side of an engine. It counts, renders and bounds the texts around
a document for one model and one ``HomerConfig``; the framework adapters measure and split
prompts with it."""

from __future__ import annotations

import functools
import re

import torch
from transformers import PreTrainedTokenizerBase

from homer_integrations.homer.config import HomerConfig, Mode, check_mode
from homer_integrations.homer.prompt import PromptText, PromptTexts, encode, render_chat, render_layout

DOCUMENTS_REMEMBERED = 4
"""Documents whose token ids ``Prompting`` keeps (an id is 8 bytes: 0.5 MB for a 64k-token document)."""
_SURROGATE = re.compile("[\ud800-\udfff]")


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


class Prompting:
    """Token counts, prompt layouts and size limits for ``tokenizer`` under ``config`` (resolved).

    ``num_layers`` bounds the merge tree's height; ``context_window`` is the model's window.
    """

    def __init__(
        self, tokenizer: PreTrainedTokenizerBase, config: HomerConfig, num_layers: int, context_window: int
    ) -> None:
        self.tokenizer = tokenizer
        self.config = config
        self.num_layers = num_layers
        self.context_window = context_window
        # A document's ids are asked for again by every question on it (the tier's build, each replay's
        # re-read): tokenizing 32k tokens costs ~0.1 s, a fifth of a GPU question. Keyed by the text
        # itself; a str caches its hash, so a hit on the caller's own string object costs nothing.
        self._document_ids = functools.lru_cache(maxsize=DOCUMENTS_REMEMBERED)(self._encode_document)

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

    def layout(self, question: str = "", mode: Mode | None = None) -> PromptTexts:
        """Prefix / suffix / continuation texts around the document for ``question`` in ``mode``
        (default: the configured one)."""
        c = self.config
        query_aware = (check_mode(mode) or c.mode) == "query_aware"
        return render_layout(
            self.tokenizer, question, c.document_suffix, query_aware, c.system_prompt, c.reask_question
        )

    @functools.cached_property
    def shared_suffix_len(self) -> int:
        """Tokens of the shared layout's suffix (what a leaf tier's split is planned for; rendered once)."""
        return encode(self.tokenizer, self.layout("", "shared").suffix, formatted=True).numel()

    def max_document_tokens(self, prefix_tokens: int = 0, suffix_tokens: int = 0) -> int:
        """Most document tokens the merge tree can hold: a tree of height h needs h + 1 layers, so at
        most ``2**(num_layers - 1)`` leaves of ``max_chunk_len - prefix_tokens - suffix_tokens`` tokens."""
        return max(0, self.config.max_chunk_len - prefix_tokens - suffix_tokens) * 2 ** (self.num_layers - 1)

    @functools.cached_property
    def max_document_chars(self) -> int:
        """A document longer than this many characters surely has more tokens than the merge tree holds.

        The bound is ``max_document_tokens() * 4 * longest_token``: no token stands for more characters
        than its vocabulary entry spells (``longest_token`` is the longest entry; byte-level and
        sentencepiece spellings are never shorter than their text), and the factor 4 leaves room for
        normalisers that compose characters. Texts over it are refused before they are tokenized.
        """
        longest = max(map(len, self.tokenizer.get_vocab()), default=1)
        return self.max_document_tokens() * 4 * max(1, longest)

    def check_document(self, document: str) -> None:
        """Refuse what is not text (``check_text``), an empty document, or one far longer than the merge
        tree holds (before tokenizing)."""
        check_text(document, "document")
        if not document or not document.strip():
            raise ValueError("the document is empty")
        if len(document) > self.max_document_chars:
            raise ValueError(
                f"the document has {len(document):,} characters, far more than this model's merge tree can "
                f"hold ({self.max_document_tokens():,} tokens at max_chunk_len={self.config.max_chunk_len} over "
                f"{self.num_layers} layers); split it, or raise max_chunk_len"
            )

    @staticmethod
    def check_question(question: str) -> None:
        """Refuse what is not text (``check_text``) or an empty question."""
        check_text(question, "question")
        if not question.strip():
            raise ValueError("the question is empty")

    def _encode_document(self, document: str) -> torch.Tensor:
        return encode(self.tokenizer, document)

    def encode_span(
        self, prefix: str, document: str, suffix: str, *, full: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Token ids ``[P]``, ``[N]``, ``[S]`` of the three spans; a document the merge tree (or, ``full``,
        the window) cannot hold is refused here, before calibration or any layer runs."""
        prefix_ids = encode(self.tokenizer, prefix, first=True, formatted=True)
        if type(document) is str:  # a PromptText's markup is not part of its str equality: not remembered
            document_ids = self._document_ids(document).clone()  # the remembered ids stay untouched
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
            raise ValueError(
                f"the document has {document_ids.numel():,} tokens, more than this model's merge tree can hold "
                f"({limit:,} at max_chunk_len={self.config.max_chunk_len} over {self.num_layers} layers); "
                f"split it, or raise max_chunk_len"
            )
        return prefix_ids, document_ids, suffix_ids
