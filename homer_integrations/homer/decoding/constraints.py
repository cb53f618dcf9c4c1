"""Constrained decoding: an answer that must match a JSON schema, a regex, one of several choices or a
Lark grammar.

A ``ResponseFormat`` compiles the user's value into an llguidance grammar once; a ``TokenMask``
walks that grammar during one decode and sets the logits of every token that cannot continue it to
``-inf`` before a token is picked (greedy or sampled), so even a random-weight model can only write
text the grammar accepts. llguidance computes a mask lazily from the tokenizer's vocabulary (about
1 ms a token on a 150k vocabulary on one CPU core) and needs no per-schema index.
"""

from __future__ import annotations

import copy
import functools
import json
import re
import threading
import weakref
from collections.abc import Iterable, Sequence
from typing import Any, Literal

import llguidance
import llguidance.hf
import torch
from pydantic import TypeAdapter
from transformers import PreTrainedTokenizerBase

FormatKind = Literal["json_schema", "regex", "choice", "grammar"]
_JSON_OPTIONS = {"whitespace_flexible": False}
"""Compact JSON: free whitespace lets a weak model pad an answer with blank lines until it runs out of tokens."""


def closed_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``schema`` whose objects with listed ``properties`` allow no other keys (unless they say so).

    In JSON Schema a missing ``additionalProperties`` means any extra key is valid, so a constrained
    model could invent keys; an answer should hold exactly the fields the schema names.
    """

    def close(node: Any) -> Any:
        if isinstance(node, dict):
            node = {k: close(v) for k, v in node.items()}
            if "properties" in node and "additionalProperties" not in node:
                node["additionalProperties"] = False
            return node
        if isinstance(node, list):
            return [close(v) for v in node]
        return node

    return close(copy.deepcopy(schema))


_FREE_STRING_BLOCKERS = ("maxLength", "enum", "const", "pattern", "format")


def bounded_strings(schema: dict[str, Any], max_new_tokens: int) -> dict[str, Any]:
    """A copy of ``schema`` whose free strings (no ``maxLength``, ``enum``, ``const``, ``pattern`` or
    ``format``) get a ``maxLength`` that lets the whole answer close within ``max_new_tokens``.

    A weak model can write one string until the budget runs out, and an answer cut inside a string
    is not JSON; with a bound the grammar closes the string and the object in time. Each free string
    node gets an equal share of the tokens left after the object's punctuation and keys (strings inside
    arrays share one item's share: arrays are not bounded). Any answer the bounded schema accepts,
    the original accepts too.
    """
    nodes: list[dict[str, Any]] = []
    skeleton = 2

    def walk(node: Any) -> Any:
        nonlocal skeleton
        if isinstance(node, list):
            return [walk(v) for v in node]
        if not isinstance(node, dict):
            return node
        node = {k: walk(v) for k, v in node.items()}
        if isinstance(node.get("properties"), dict):
            skeleton += sum(len(name) // 3 + 3 for name in node["properties"])
        if node.get("type") == "string" and not any(k in node for k in _FREE_STRING_BLOCKERS):
            nodes.append(node)
        return node

    bounded = walk(schema)
    if nodes:
        share = max(1, max_new_tokens - skeleton) // len(nodes)
        for node in nodes:
            # a token inside a string adds at least one character (escapes aside), so a string of at most
            # ``share`` characters never outruns its share, even written digit by digit
            node["maxLength"] = max(8, share)
    return bounded


def endless_path(schema: dict[str, Any]) -> str | None:
    """Where ``schema`` requires itself: the ``$ref`` a required chain leads back to (an object whose required
    property is that object again, with no alternative, optional step or empty array to end it), else None.
    No finite JSON matches such a schema; decoding it ran until the budget and failed inside the grammar."""

    def target(ref: str) -> Any:
        node: Any = schema
        for part in ref.removeprefix("#").strip("/").split("/") if ref != "#" else []:
            node = node.get(part.replace("~1", "/").replace("~0", "~")) if isinstance(node, dict) else None
        return node

    def endless(node: Any, seen: tuple[str, ...]) -> str | None:
        if not isinstance(node, dict):
            return None
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#"):
            return ref if ref in seen else endless(target(ref), (*seen, ref))
        for part in node.get("allOf", ()):
            if (found := endless(part, seen)) is not None:
                return found
        for key in ("anyOf", "oneOf"):  # endless only if every alternative is
            branches = [endless(b, seen) for b in node.get(key, ())]
            if branches and all(b is not None for b in branches):
                return branches[0]
        properties = node.get("properties") if isinstance(node.get("properties"), dict) else {}
        for name in node.get("required", ()) if isinstance(node.get("required"), list) else ():
            if (found := endless(properties.get(name), seen)) is not None:
                return found
        if node.get("type") == "array" and isinstance(node.get("minItems"), int) and node["minItems"] > 0:
            return endless(node.get("items"), seen)
        return None

    return endless(schema, ("#",))


def schema_of(value: type | dict[str, Any]) -> dict[str, Any]:
    """The JSON schema of a pydantic model, TypedDict, dataclass or other type, or ``value`` if it is one."""
    if isinstance(value, dict):
        return value
    return TypeAdapter(value).json_schema()


class ResponseFormat:
    """What an answer must look like, compiled to an llguidance grammar.

    Build one with ``ResponseFormat.of(value)``: a JSON schema ``dict``; a pydantic model class,
    TypedDict or dataclass (its JSON schema); a compiled regex (``re.compile(r"\\d{4}")``); a list or
    tuple of strings (exactly one of them); or use ``json_schema`` / ``regex`` / ``choice`` / ``lark``.
    ``parse`` turns a finished answer into a value (a validated instance for a type). Immutable.

    Attributes:
        kind: ``json_schema``, ``regex``, ``choice`` or ``grammar``.
        grammar: the llguidance grammar (validated on construction: a bad format fails before decoding).
        schema: the JSON schema answers follow (``json_schema`` only), objects closed (``closed_schema``).
        target: the type answers are validated as (formats built from a type), else None.
    """

    __slots__ = ("grammar", "kind", "schema", "target")

    def __init__(self, kind: FormatKind, grammar: str, schema: dict[str, Any] | None = None, target: Any = None):
        error = llguidance.LLMatcher.validate_grammar(grammar)
        if error and not error.startswith("WARNING"):
            raise ValueError(f"invalid {kind} response format: {error}")
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "grammar", grammar)
        object.__setattr__(self, "schema", schema)
        object.__setattr__(self, "target", target)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("a ResponseFormat is immutable")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ResponseFormat) and (self.kind, self.grammar) == (other.kind, other.grammar)

    def __hash__(self) -> int:
        return hash((self.kind, self.grammar))

    def __repr__(self) -> str:
        what = self.target.__name__ if self.target is not None else self.schema or self.grammar[:60]
        return f"ResponseFormat({self.kind}: {what})"

    @classmethod
    def of(cls, value: Any) -> ResponseFormat:
        """Compile ``value`` (see the class docstring); a ``ResponseFormat`` is returned as is."""
        if isinstance(value, ResponseFormat):
            return value
        if isinstance(value, re.Pattern):
            return cls.regex(value.pattern)
        if isinstance(value, dict | type):
            return cls.json_schema(value)
        if isinstance(value, list | tuple) and value and all(isinstance(v, str) for v in value):
            return cls.choice(value)
        raise TypeError(
            f"unsupported response_format {value!r}: pass a JSON schema dict, a pydantic model class or "
            f"TypedDict, a compiled regex (re.compile), a list of choices, or a ResponseFormat"
        )

    @classmethod
    def json_schema(cls, schema: dict[str, Any] | type) -> ResponseFormat:
        """JSON matching ``schema`` (a dict, or a type whose schema pydantic derives); compact, no extra keys."""
        target = None if isinstance(schema, dict) else schema
        resolved = closed_schema(schema_of(schema))
        loop = endless_path(resolved)
        if loop is not None:
            raise ValueError(
                f"invalid json_schema response format: it requires itself without end (through {loop!r}); "
                "make the recursive property optional, nullable or an array that may be empty"
            )
        grammar = llguidance.LLMatcher.grammar_from_json_schema(resolved, overrides=_JSON_OPTIONS)
        return cls("json_schema", grammar, resolved, target)

    @classmethod
    def regex(cls, pattern: str) -> ResponseFormat:
        """Text that matches ``pattern`` as a whole."""
        return cls("regex", llguidance.LLMatcher.grammar_from_regex(pattern))

    @classmethod
    def choice(cls, options: Sequence[str]) -> ResponseFormat:
        """Exactly one of ``options``."""
        if not options:
            raise ValueError("a choice needs at least one option")
        return cls("choice", llguidance.LLMatcher.grammar_from_regex("|".join(re.escape(o) for o in options)))

    @classmethod
    def lark(cls, grammar: str) -> ResponseFormat:
        """Text of a Lark grammar in llguidance's dialect (``%json {...}`` embeds a JSON schema)."""
        return cls("grammar", llguidance.LLMatcher.grammar_from_lark(grammar))

    def within(self, max_new_tokens: int) -> ResponseFormat:
        """This format with its JSON schema's free strings bounded to fit ``max_new_tokens`` (see
        ``bounded_strings``); other kinds, and schemas without free strings, are returned as they are."""
        if self.kind != "json_schema" or self.schema is None:
            return self
        return _bounded(self, max_new_tokens)

    def instructions(self) -> str:
        """A one-line prompt note for JSON formats: the fields to fill (the grammar enforces them, the note
        tells the model what they mean); empty for other kinds. Adapters add it after the question."""
        if self.kind != "json_schema" or self.schema is None:
            return ""
        props = self.schema.get("properties")
        if not isinstance(props, dict) or not props:
            return "Answer only with a JSON object."
        fields = ", ".join(
            f"{name} ({' '.join(str(spec['description']).split())})"
            if isinstance(spec, dict) and spec.get("description")
            else name
            for name, spec in props.items()
        )
        return f"Answer only with a JSON object with the fields: {fields}."

    def parse(self, text: str) -> Any:
        """The answer as a value: an instance of the target type, parsed JSON, or the text itself.

        Raises ``ValueError`` when the text does not parse (an answer cut by ``max_new_tokens`` or a stop string).
        """
        if self.kind != "json_schema":
            return text
        if self.target is not None:
            return TypeAdapter(self.target).validate_json(text)
        try:
            return json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"the answer is not complete JSON ({e}); was it cut by max_new_tokens?") from e


@functools.lru_cache(maxsize=64)
def _bounded(fmt: ResponseFormat, max_new_tokens: int) -> ResponseFormat:
    schema = bounded_strings(fmt.schema or {}, max_new_tokens)
    if schema == fmt.schema:
        return fmt
    grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, overrides=_JSON_OPTIONS)
    return ResponseFormat("json_schema", grammar, schema, fmt.target)


# ------------------------------------------------------------------------------------- decoding
_ll_tokenizers: weakref.WeakKeyDictionary[PreTrainedTokenizerBase, dict[tuple, llguidance.LLTokenizer]] = (
    weakref.WeakKeyDictionary()
)
_ll_lock = threading.Lock()


def ll_tokenizer(tokenizer: PreTrainedTokenizerBase, vocab_size: int, eos: Iterable[int]) -> llguidance.LLTokenizer:
    """llguidance's view of ``tokenizer`` (built once, ~0.5-2 s, then cached per tokenizer)."""
    key = (vocab_size, tuple(sorted(eos)))
    with _ll_lock:
        cached = _ll_tokenizers.setdefault(tokenizer, {})
        if key not in cached:
            if not getattr(tokenizer, "is_fast", False):
                raise ValueError("constrained decoding needs a fast (Rust) Hugging Face tokenizer")
            cached[key] = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size, eos_token=list(key[1]))
        return cached[key]


class TokenMask:
    """Walks one answer through a ``ResponseFormat``'s grammar: masks logits, then advances by the chosen token."""

    _BITS = torch.tensor([1 << i for i in range(32)], dtype=torch.int64).to(torch.int32)

    def __init__(self, fmt: ResponseFormat, tokenizer: llguidance.LLTokenizer) -> None:
        self.format = fmt
        self._matcher = llguidance.LLMatcher(tokenizer, fmt.grammar, log_level=0)
        self._check()
        self._vocab = tokenizer.vocab_size
        self._words = torch.zeros((self._vocab + 31) // 32, dtype=torch.int32)

    def _check(self) -> None:
        if self._matcher.is_error():
            raise RuntimeError(f"constrained decoding failed: {self._matcher.get_error()}")

    def apply(self, logits: torch.Tensor) -> None:
        """Set the logits [V] of tokens the grammar forbids next to ``-inf``, in place."""
        self._matcher.unsafe_compute_mask_ptr(self._words.data_ptr(), self._words.numel() * 4)
        self._check()
        allowed = ((self._words[:, None] & self._BITS) != 0).flatten()
        n = min(self._vocab, logits.shape[-1])
        forbidden = torch.ones(logits.shape[-1], dtype=torch.bool)
        forbidden[:n] = ~allowed[:n]
        logits.masked_fill_(forbidden.to(logits.device), float("-inf"))

    def advance(self, token: int) -> None:
        """Consume the chosen ``token`` (one the mask allowed)."""
        self._matcher.consume_token(token)
        self._check()

    @property
    def finished(self) -> bool:
        """The grammar is complete and admits no further token: the answer ends here."""
        return self._matcher.is_stopped()
