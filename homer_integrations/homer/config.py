"""``HomerConfig``: the HOMER settings a user sets, validated, with the reason in each error."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer, model_validator

if TYPE_CHECKING:
    from homer_integrations.homer.kv.compressed import CompressedDocument

Mode = Literal["auto", "shared", "query_aware", "full"]
MODES: tuple[Mode, ...] = get_args(Mode)
"""The modes a call can pick: ``auto`` (the default: ``full`` for a document that fits the model's window,
else ``query_aware``; ``HomerModel.mode_for`` decides per document), ``shared``, ``query_aware``, ``full``."""


def check_mode(mode: Any) -> Mode | None:
    """``mode`` when it is one of ``MODES`` or None (the configured default); else a ``ValueError`` naming them."""
    if mode is not None and (not isinstance(mode, str) or mode not in MODES):
        choices = ", ".join(repr(m) for m in MODES)
        raise ValueError(f"unknown HOMER mode {mode!r}: use one of {choices}, or None for the engine's default")
    return mode


def first_mode(*requested: Any) -> Mode | None:
    """The first of ``requested`` that is not None, checked by ``check_mode`` (None when none is set): a
    call's ``mode=`` before an adapter's setting. ``resolve_mode`` decides with it."""
    for mode in requested:
        if check_mode(mode) is not None:
            return mode
    return None


def resolve_mode(
    *requested: Any,
    default: Mode | None = None,
    question: object = None,
    compressed: CompressedDocument | None = None,
    window: int | None = None,
) -> Mode:
    """The mode that serves a call: the one place it is decided.

    ``requested``: the explicit modes, most specific first (a call's ``mode=``, then an adapter's
    setting); the first that is not None wins, checked by ``check_mode``. With none, ``default`` (the
    engine's configured mode); without one either, ``query_aware`` when a ``question`` is compressed
    with the document, else ``shared``. A ``compressed`` document serves in the mode it was compressed
    in, whatever was requested (the request is still checked): ``query_aware`` when it holds a
    question, ``full`` when it is one uncompressed chunk as long as the model's ``window``, else
    ``shared``.
    """
    chosen = first_mode(*requested)
    if compressed is not None:
        stats = compressed.stats
        if compressed.question is not None:
            return "query_aware"
        return "full" if stats.max_chunk_len == window and stats.tree_height == 0 else "shared"
    if chosen is not None:
        return chosen
    if default is not None:
        return default
    return "query_aware" if question is not None else "shared"


DEFAULT_DOCUMENT_SUFFIX = "\n\n(End of the document.)\n\n"

_UNITS = {
    "shared_root": {
        "auto": "AutoRoot",
        "headwise": "HeadwiseRoot",
        "flat": "FlatRoot",
        "recompute": "RecomputeRoot",
        "tree": "TreeRoot",
    },
    "replay": {"recompute": "RecomputeReplay", "flat": "FlatReplay", "tree": "TreeReplay"},
}
_SCORING = (
    "scoring=Scoring(...)",
    "with the score units you want (Scoring.default(): the package's, homer.scoring.chain)",
)
REMOVED_FIELDS: dict[str, tuple[str, str]] = {
    "reask_question": ("reask_question={value!r}", ""),
    "score_pooling": _SCORING,
    "pool_unit": _SCORING,
    "score_memory": _SCORING,
    "shared_scorer": (
        "scoring=Scoring.default(), question_scoring=Scoring.for_questions()",
        "for the last-token scorer (reconstruction is the default)",
    ),
    "replay": ("replay={unit}", ""),
    "shared_root": ("shared_root={unit}", ""),
    "calibration_segments": ("calibration_segments={value!r}", ""),
}
"""The research switches that left ``HomerConfig``: what replaces each in ``Recipe(...)``, and a note."""


def removed_field_message(name: str, value: Any) -> str:
    """Why ``name`` is refused and what replaces it in a ``Recipe`` (``REMOVED_FIELDS``), for ``value``."""
    units = _UNITS.get(name, {})
    unit = (
        f"{units[value]}()"
        if isinstance(value, str) and value in units
        else " | ".join(f"{u}()" for u in units.values())
    )
    replacement, note = REMOVED_FIELDS[name]
    recipe = f"Recipe({replacement.format(value=value, unit=unit)})"
    return (
        f"{name} was removed from HomerConfig; pass HomerModel(recipe={recipe}){' ' + note if note else ''} "
        f"(Recipe and its units: homer_integrations.homer.reading.strategies)"
    )


class HomerConfig(BaseModel):
    """What a user sets for hierarchical context merging. ``None`` means "pick the default for this model".

    Attributes:
        max_chunk_len: MCL, tokens per chunk including prefix and suffix; no RoPE position
            reaches it. Default: per model (see ``resolve``).
        warmup_layers: W, extra layers the leaves run before merging starts.
            Default: per model.
        final_cache_len: tokens kept in the final cache (default: ``max_chunk_len``).
        mode: which cache answers (every answering call can override it): ``auto`` (the default) keeps a
            document that fits the model's window whole (``full``: one prefill, then every question reads
            it in about a second) and answers a longer one ``query_aware``; ``query_aware`` puts the
            question in the suffix (paper), selecting per question from the document's leaf tier (past
            the window: the passages BM25 ranks best) and re-reading the kept tokens; a question-less
            preparation (``cache_document``, ``homer-qa compress``) builds that leaf tier; ``shared``
            compresses the document once with a question-independent suffix, so one short cache serves
            every question (fast, loses facts as documents grow); ``full`` keeps the whole prompt
            uncompressed (a plain prefill, exact; the document must fit the model's window).
        document_suffix: the fixed text after the document in ``shared`` mode.
        system_prompt: system message placed in the prefix (chat models).
        split: how a document is cut into leaves: ``even`` (the paper: ``2**h`` pieces of equal length)
            or ``content`` (pieces cut at statement ends chosen by their own tokens,
            ``homer.document.content_split``, so an edit changes only the leaves around it; a tree over any
            number of leaves). Left out of every dump (and so of every cache key) while ``even``.

    How the caches are built (the shared root's builder, the per-question replay, the scoring, the
    re-asked question, the calibration's size) is a ``homer.reading.strategies.Recipe`` handed to
    ``HomerModel(recipe=...)``: research switches whose defaults are the measured best. Passing one of
    the fields they replaced (``REMOVED_FIELDS``) raises an error that names the replacement.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_chunk_len: int | None = Field(default=None, ge=64, le=1_048_576)
    warmup_layers: int | None = Field(default=None, ge=0)
    final_cache_len: int | None = Field(default=None, ge=16)
    mode: Mode = "auto"
    document_suffix: str = Field(default=DEFAULT_DOCUMENT_SUFFIX, min_length=1)
    system_prompt: str | None = None
    split: Literal["even", "content"] = "even"

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # the default split is not dumped, so the keys and job ids of configs from before it stay the same
        data = handler(self)
        if data.get("split") == "even":
            del data["split"]
        return data

    @model_validator(mode="before")
    @classmethod
    def _removed_fields(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for name in REMOVED_FIELDS:
                if name in data:
                    raise ValueError(removed_field_message(name, data[name]))
        return data

    @model_validator(mode="after")
    def _cache_fits_chunk(self) -> HomerConfig:
        if (
            self.final_cache_len is not None
            and self.max_chunk_len is not None
            and self.final_cache_len > self.max_chunk_len
        ):
            raise ValueError(
                f"final_cache_len ({self.final_cache_len}) must not exceed max_chunk_len "
                f"({self.max_chunk_len}): the root chunk is never longer than one chunk"
            )
        return self

    def resolve(self, num_layers: int, max_positions: int, defaults: ModelDefaults) -> HomerConfig:
        """A copy with every ``None`` filled from ``defaults`` and checked against the model.

        Raises ``ValueError`` naming the setting when it does not fit the model.
        """
        mcl = self.max_chunk_len or defaults.max_chunk_len
        warmup = self.warmup_layers if self.warmup_layers is not None else defaults.warmup_layers
        final = self.final_cache_len or min(defaults.final_cache_len or mcl, mcl)
        if mcl > max_positions:
            raise ValueError(
                f"max_chunk_len={mcl} exceeds the model's {max_positions} positions "
                f"(max_position_embeddings); HOMER keeps every position below max_chunk_len"
            )
        if warmup >= num_layers:
            raise ValueError(
                f"warmup_layers={warmup} must be below the model's {num_layers} layers: the merge "
                f"levels need at least one layer"
            )
        if final > mcl:
            raise ValueError(f"final_cache_len ({final}) must not exceed max_chunk_len ({mcl})")
        return self.model_copy(update={"max_chunk_len": mcl, "warmup_layers": warmup, "final_cache_len": final})


class ModelDefaults(BaseModel):
    """Per-model defaults for the settings a ``HomerConfig`` leaves as ``None``."""

    model_config = ConfigDict(frozen=True)

    max_chunk_len: int
    warmup_layers: int
    final_cache_len: int | None = None
    """None: the final cache is one chunk long (``max_chunk_len``)."""

    @classmethod
    def for_model(cls, num_layers: int, max_positions: int) -> ModelDefaults:
        """Generic rule: half the trained window (at most 4096) and about 60% warm-up layers."""
        return cls(max_chunk_len=min(4096, max(64, max_positions // 2)), warmup_layers=round(0.6 * num_layers))
