"""Passages: statements grouped into passages, ranked by attention and BM25 together, kept whole."""

from __future__ import annotations

import itertools

import pytest
import torch

from homer_integrations.homer.document.prompt import encode, encode_offsets, unit_ids
from homer_integrations.homer.reading.budget import ReadBudget
from homer_integrations.homer.reading.passages import Passages, PassageSelection, spans
from homer_integrations.homer.scoring.chain import Scoring
from homer_integrations.homer.tree.recompute import reread
from tests.conftest import mode_engine, tiny_model
from tests.homer.leaves.tier_helpers import compressor, ids

TEXT = (
    "The garden was quiet that morning. Nobody had seen the gardener since Tuesday.\n\n"
    "The parcel from Bristol held exactly seventeen silver spoons. The cook said nothing about it.\n\n"
    "Rain fell over the hills until dusk. The vicar walked home along the river. "
    "His sister had gone to Bath for the winter.\n\n"
    "Nobody in the village knew why the mill had stopped."
)


def test_spans_keep_statements_whole_within_the_size_and_end_at_paragraphs() -> None:
    counts = torch.tensor([4, 2, 2, 9, 5, 1])
    starts, stops = spans(counts, [False] * 6, tokens=8, overlap=0)
    # 4+2+2 fill one passage; 9 is cut into 8 and 1; 1+5+1
    assert starts.tolist() == [0, 8, 16] and stops.tolist() == [8, 16, 23]
    starts, _ = spans(counts, [True, False, False, False, False, False], tokens=8, overlap=0)
    assert starts.tolist() == [0, 4, 8, 16], "a half-full passage ends with its paragraph"
    starts, _ = spans(counts, [False, True, False, False, False, False], tokens=16, overlap=0)
    assert starts.tolist() == [0, 8], "not before it is half full"
    starts, stops = spans(counts, [False] * 6, tokens=8, overlap=3)
    assert starts.tolist() == [0, 5, 13] and stops.tolist() == [8, 16, 23], "each passage reads 3 tokens back"
    with pytest.raises(ValueError, match="overlap"):
        spans(counts, [False] * 6, tokens=8, overlap=-1)


@pytest.fixture(scope="module")
def passages(tokenizer) -> tuple[Passages, torch.Tensor]:
    document_ids = encode(tokenizer, TEXT)
    statements = unit_ids(tokenizer, TEXT, "statement")
    return PassageSelection(tokens=24, overlap=4).passages(tokenizer, document_ids, statements), document_ids


def test_passages_cover_the_document_and_bm25_finds_the_asked_one(passages, tokenizer) -> None:
    found, document_ids = passages
    assert len(found) >= 3 and int(found.starts[0]) == 0 and int(found.stops[-1]) == document_ids.numel()
    assert bool((found.starts[1:] <= found.stops[:-1]).all()), "no token falls between passages"
    (hit, *_) = found.index.search("How many silver spoons were in the parcel from Bristol?", 3)
    assert "seventeen silver spoons" in tokenizer.decode(document_ids[found.tokens(hit.index)].tolist())


def test_selection_fuses_attention_and_bm25_and_keeps_whole_passages_within_budget(passages, tokenizer) -> None:
    found, document_ids = passages
    question = "How many silver spoons were in the parcel from Bristol?"
    bm25_best = found.index.search(question, 1)[0].index
    scores = torch.zeros(document_ids.numel())
    attended = (bm25_best + 2) % len(found)
    scores[int(found.stops[attended]) - 5] = 5.0  # attention prefers another passage (outside any overlap)
    fused = PassageSelection(tokens=24, overlap=4, attention=1.0)
    ranking = fused.ranking(question, scores, found)
    assert set(ranking[:2]) == {bm25_best, attended}, "each signal's best passage leads the fusion"
    lexical_only = PassageSelection(tokens=24, overlap=4).ranking(question, None, found)
    assert lexical_only[0] == bm25_best and attended not in lexical_only[:1], "the default is BM25 alone"
    assert lexical_only == PassageSelection(tokens=24, overlap=4).ranking(question, scores, found)
    with pytest.raises(ValueError, match="scores"):
        fused.ranking(question, None, found)
    budget = int((found.stops - found.starts)[[bm25_best, attended]].sum())
    kept = fused.select(question, scores, found, budget)
    assert torch.equal(kept, kept.unique()) and kept.numel() <= budget
    for passage in (bm25_best, attended):
        assert set(found.tokens(passage).tolist()) <= set(kept.tolist()), "whole passages"
    with pytest.raises(ValueError, match="fits"):
        PassageSelection(tokens=24, overlap=4).select(question, scores, found, budget=2)
    with pytest.raises(ValueError, match="at least 16"):
        PassageSelection(tokens=8)
    with pytest.raises(ValueError, match="negative"):
        PassageSelection(attention=-1.0)


def test_document_scores_are_what_the_flat_selection_ranks() -> None:
    """The recompute replay keeps the best tokens by exactly these scores."""
    model = tiny_model("qwen2", vocab_size=256)
    prefix, doc, suffix = ids(model, 5, 1), ids(model, 600, 2), ids(model, 6, 3)
    comp = compressor(model, final_cache_len=96, scoring=Scoring.for_questions())
    words = torch.arange(doc.numel()) // 3
    tier = comp.leaves.build(prefix, doc, word_ids=words)
    scores = comp.flat.document_scores(tier, suffix)
    assert scores.shape == (doc.numel(),) and bool(scores.isfinite().all())
    result = comp.flat.replay_recompute(tier, prefix, doc, suffix)
    kept = torch.zeros(doc.numel(), dtype=torch.bool)
    kept[result.origin[result.origin >= 0]] = True
    assert float(scores[kept].min()) >= float(scores[~kept].max()) - 1e-5, "the kept tokens are the best scored"
    again = reread(comp.nodes, tier.plan.with_suffix(suffix.numel()), prefix, doc, kept.nonzero()[:, 0], suffix, 0.0)
    torch.testing.assert_close(again.next_token_logits, result.next_token_logits)


def _runs(origin: torch.Tensor) -> list[int]:
    """Lengths of the runs of consecutive document indices among the kept ones."""
    kept = origin[origin >= 0]
    breaks = (kept[1:] != kept[:-1] + 1).nonzero()[:, 0].tolist()
    edges = [-1, *breaks, kept.numel() - 1]
    return [b - a for a, b in itertools.pairwise(edges)]


def test_past_the_window_the_default_replay_rereads_whole_passages(tokenizer, calibration, novel) -> None:
    from homer_integrations.homer.reading.strategies import AutoReplay, PassageReplay, Recipe, RecomputeReplay

    engine = mode_engine(tokenizer, calibration)
    # the tiny engine keeps 128 tokens (a budget of no seconds stays at final_cache_len)
    small = PassageReplay(PassageSelection(tokens=24, overlap=8), ReadBudget(seconds=0, least=None))
    engine.tiers.recipe = Recipe(replay=AutoReplay(small), calibration_segments=2)
    book = novel[20_000:32_000]
    question = "Who walked to Meryton with the sisters?"
    assert engine.prompting.count_tokens(book) > engine.context_window, "the document is past the window"
    passages = engine.compress(book, question=question, mode="query_aware")
    assert min(_runs(passages.origin)) >= 16, "whole passages, not scattered statements"
    tokens = mode_engine(tokenizer, calibration)
    tokens.tiers.recipe = Recipe(replay=RecomputeReplay(), calibration_segments=2)
    scattered = tokens.compress(book, question=question, mode="query_aware")
    assert len(_runs(scattered.origin)) > 2 * len(_runs(passages.origin))
    assert passages.num_tokens <= 128


def test_past_the_window_bm25_passages_need_no_leaf_tier_and_attention_builds_it_once(
    tokenizer, calibration, novel
) -> None:
    from homer_integrations.homer.reading.strategies import AutoReplay, PassageReplay, Recipe

    book, question = novel[20_000:32_000], "Who walked to Meryton with the sisters?"
    engine = mode_engine(tokenizer, calibration)
    engine.tiers.recipe = Recipe(replay=AutoReplay(PassageReplay(PassageSelection(tokens=24))), calibration_segments=2)
    stream = engine.run(book, question, mode="query_aware", max_new_tokens=2)
    stream.text()
    info = stream.info
    assert info.cache_source == "computed" and info.document_seconds == 0.0
    assert engine.tiers.document_cache.stats().entries == 0, "no leaf tier was built or stored"
    tokens, source, _ = engine.cache_document(book, "query_aware")
    assert source is None and tokens > engine.context_window, "nothing to prepare: questions read the text"
    assert engine.tiers.document_cache.stats().entries == 0
    grown = engine.compress(book, question=question, mode="query_aware").num_tokens
    assert 128 < grown <= engine.context_window // 2 + 64, "a fast machine re-reads more than final_cache_len"
    fused = PassageReplay(PassageSelection(tokens=24, attention=1.0))
    engine.tiers.recipe = Recipe(replay=AutoReplay(fused), calibration_segments=2)
    first = engine.run(book, question, mode="query_aware", max_new_tokens=2)
    first.text()
    again = engine.run(book, "Where did they walk?", mode="query_aware", max_new_tokens=2)
    again.text()
    assert (first.info.cache_source, again.info.cache_source) == ("computed", "memory"), (
        "the tier is built once, then read"
    )
    assert engine.cache_document(book, "query_aware")[1] == "memory", "the fused selection's tier is prepared"
    assert engine.tiers.document_cache.stats().entries == 1


def test_within_the_window_the_default_replay_is_the_token_selection(tokenizer, calibration, text) -> None:
    from homer_integrations.homer.reading.strategies import Recipe, RecomputeReplay

    question = "Who is in want of a wife?"
    default = mode_engine(tokenizer, calibration, final_cache_len=96).compress(text, question=question)
    engine = mode_engine(tokenizer, calibration, final_cache_len=96)
    engine.tiers.recipe = Recipe(replay=RecomputeReplay(), calibration_segments=2)
    assert torch.equal(default.origin, engine.compress(text, question=question).origin)


LEASE = (
    "The landlord repaints the hall every spring. The boiler is serviced in October.\n\n"
    "Rent is paid on the first day of each month by transfer. Late rent bears no interest.\n\n"
    "The tenant may sublet the attic to a lodger with the landlord's written consent.\n\n"
    "Keys are returned on the last day of the lease."
)
DEED = (
    "The orchard passes to the buyer with its well. The fences stay where they stand.\n\n"
    "The seller keeps the right to cross the lower field on foot."
)


@pytest.fixture(scope="module")
def corpus_passages(tokenizer) -> tuple[str, Passages, torch.Tensor]:
    from homer_integrations.corpus import Corpus

    text = Corpus({"deed.txt": DEED, "lease.txt": LEASE, "notes.txt": TEXT}).text
    document_ids = encode(tokenizer, text)
    statements = unit_ids(tokenizer, text, "statement")
    return text, PassageSelection(tokens=24, overlap=4).passages(tokenizer, document_ids, statements), document_ids


def header_tokens(tokenizer, text: str, name: str) -> set[int]:
    """Token indices of ``text``'s ``Document: <name>`` line, its line break included."""
    start = text.index(f"Document: {name}\n")
    end = start + len(f"Document: {name}\n")
    offsets = encode_offsets(tokenizer, text)[1]
    return set(((offsets[:, 0] < end) & (offsets[:, 1] > start)).nonzero()[:, 0].tolist())


SUBLET = "Which contract lets the tenant sublet the attic to a lodger?"


def test_a_kept_passage_keeps_its_documents_header_within_the_budget(corpus_passages, tokenizer) -> None:
    text, found, document_ids = corpus_passages
    best = PassageSelection(tokens=24, overlap=4).ranking(SUBLET, None, found)[0]
    passage = set(found.tokens(best).tolist())
    header = header_tokens(tokenizer, text, "lease.txt")
    assert header and not header & passage, "the passage is from the lease's middle, past its header"
    assert set(found.heading(best).tolist()) == header, "the heading is the header line's statement"
    size = len(passage | header)
    kept = PassageSelection(tokens=24, overlap=4).select(SUBLET, None, found, budget=size)
    assert torch.equal(kept, kept.unique()) and kept.numel() <= size, "the header is charged to the budget"
    assert set(kept.tolist()) == passage | header
    assert "Document: lease.txt" in tokenizer.decode(document_ids[kept].tolist())
    alone = PassageSelection(tokens=24, overlap=4).select(SUBLET, None, found, budget=len(passage))
    assert set(alone.tolist()) == passage, "no room for the header: the passage alone, not skipped"


def test_a_header_kept_once_is_not_charged_again(corpus_passages, tokenizer) -> None:
    text, found, _ = corpus_passages
    selection = PassageSelection(tokens=24, overlap=4)
    kept = [set(r.tolist()) for r in selection.taken(SUBLET, None, found, budget=4 * selection.tokens)]
    offsets = encode_offsets(tokenizer, text)[1]
    start = text.index(LEASE)
    lease = set(((offsets[:, 0] >= start) & (offsets[:, 1] <= start + len(LEASE))).nonzero()[:, 0].tolist())
    assert sum(bool(run & lease) for run in kept) >= 2, "two lease passages are kept"
    assert sum(map(len, kept)) == len(set().union(*kept)) <= 4 * selection.tokens, "no token is charged twice"
    header = header_tokens(tokenizer, text, "lease.txt")
    assert [bool(header & run) for run in kept].count(True) == 1, "the lease header is taken with one passage only"
    assert header <= set().union(*kept)


def test_without_headings_the_selection_is_the_passages_alone(corpus_passages, passages, tokenizer) -> None:
    text, _, document_ids = corpus_passages
    off = PassageSelection(tokens=24, overlap=4, heading=None)
    plain = off.passages(tokenizer, document_ids, unit_ids(tokenizer, text, "statement"))
    assert not bool(plain.headings.any()), "heading=None: no headings"
    question = "How many silver spoons were in the parcel from Bristol?"
    for budget in (24, 48, 96, 1000):
        kept = torch.cat(off.taken(question, None, plain, budget))
        spans = torch.cat([plain.tokens(p) for p in off.ranking(question, None, plain)])
        assert set(kept.tolist()) <= set(spans.tolist()) and kept.numel() <= budget
    book, _ = passages  # TEXT has no `Document:` line: the default selects as heading=None does
    assert not bool(book.headings.any())
    for budget in (24, 48, 96, 1000):
        assert torch.equal(
            PassageSelection(tokens=24, overlap=4).select(question, None, book, budget),
            off.select(question, None, book, budget),
        )


def test_passage_selection_stems_its_bm25_words_unless_told_not_to(tokenizer) -> None:
    document_ids = encode(tokenizer, TEXT)
    statements = unit_ids(tokenizer, TEXT, "statement")
    question = "Where does the vicar's sister go to spend the winters?"  # the text: "gone", "winter"
    kept = {}
    for stemmer in ("english", None):
        selection = PassageSelection(tokens=24, overlap=0, stemmer=stemmer)
        found = selection.passages(tokenizer, document_ids, statements)
        kept[stemmer] = tokenizer.decode(document_ids[selection.select(question, None, found, 24)].tolist())
    assert "Bath for the winter" in kept["english"]
    assert "winter" not in kept[None], "as written, 'winters' misses 'winter': the vicar's passage ranks first"
    assert PassageSelection(stemmer="german").stemmer == "german"
    with pytest.raises(ValueError, match="not a Snowball stemmer"):
        PassageSelection(stemmer="klingon")


@pytest.mark.parametrize("text", ["1 2 3 4 5 6 7 8 9 0\n\n", "\U0001f600 \U0001f680 \U0001f525 \n\n"])
def test_a_document_of_no_word_bm25_knows_is_read_in_document_order(tokenizer, calibration, text: str) -> None:
    """Digits or emoji past the window: bm25s cannot index an empty vocabulary, and the question crashed with
    "max() arg is an empty sequence" (issue 82, item 2). Nothing matches, so passages are taken in order."""
    from homer_integrations.homer.scoring.lexical import BM25Index

    assert BM25Index([text, text]).search("What is the code?") == []
    engine = mode_engine(tokenizer, calibration)
    document = text * (2400 // engine.count_tokens(text))  # about 2,400 tokens: past the window, within the tree
    assert engine.count_tokens(document) > engine.context_window and engine.mode_for(document=document) == "query_aware"
    doc = engine.compress(document, question="What is the code?", mode="query_aware")
    kept = doc.origin[doc.origin >= 0]
    assert kept.numel() > 0 and int(kept.min()) == 0, "the first passages, in document order"
    assert isinstance(engine.answer(document, "What is the code?", max_new_tokens=2), str)


def test_the_passages_count_the_documents_a_text_joins(corpus_passages, passages, tokenizer) -> None:
    """A corpus of three ``Document:`` sections joins three documents (``ReadBudget.across`` then applies);
    a text without headings is one."""
    text, found, document_ids = corpus_passages
    assert found.documents == 3
    assert passages[0].documents == 1
    off = PassageSelection(tokens=24, overlap=4, heading=None)
    assert off.passages(tokenizer, document_ids, unit_ids(tokenizer, text, "statement")).documents == 1
