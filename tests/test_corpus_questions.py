"""Questions across a corpus on a tiny random-weight engine: its answers are noise, but the sources it cites
must be exact ranges of the named documents, and past the window BM25 must pick the document the question
shares rare words with."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch

from homer_integrations import HomerConfig, HomerModel
from homer_integrations.corpus import Corpus, NamedText, Source, ask_corpus, document_name, stream_corpus
from homer_integrations.corpus.questions import HEADER, kept_ranges
from homer_integrations.documents import DocumentError
from homer_integrations.homer.reading.budget import ReadBudget
from homer_integrations.homer.reading.passages import PassageSelection
from homer_integrations.homer.reading.strategies import AutoReplay, PassageReplay, Recipe
from tests.conftest import tiny_model

RARE = "The quillwort zephyrine marmalade treaty was signed at Okeechobee by the marquess."
QUESTION = "Where was the quillwort zephyrine marmalade treaty signed?"


def corpus_engine(tokenizer, calibration) -> HomerModel:
    """A tiny Llama (window 2048) keeping 128 tokens: 24-token BM25 passages past the window, no re-read budget."""
    passages = PassageReplay(PassageSelection(tokens=24, overlap=8), ReadBudget(seconds=0, least=None, across=16))
    recipe = Recipe(replay=AutoReplay(passages), calibration_segments=2)
    config = HomerConfig(max_chunk_len=128, warmup_layers=3)
    return HomerModel(
        tiny_model(), tokenizer, config, model_name="tiny", calibration_dir=calibration, progress=False, recipe=recipe
    )


def short_texts(novel: str) -> dict[str, str]:
    """Three short documents (about 240 tokens together: within the window), the second the rare words."""
    return {"x.txt": novel[20_000:20_400], "y.txt": f"  {RARE}\n", "z.txt": novel[21_000:21_400]}


@pytest.fixture(scope="module")
def engine(tokenizer, calibration) -> HomerModel:
    return corpus_engine(tokenizer, calibration)


@pytest.fixture(scope="module")
def long_corpus(novel: str) -> Corpus:
    """Three ~900-token documents; only the second holds the question's rare words."""
    middle = novel[24_000:27_000]
    middle = f"{middle[:1500]} {RARE} {middle[1500:]}"
    return Corpus({"a.txt": novel[20_000:24_000], "b.txt": middle, "c.txt": novel[28_000:32_000]})


def assert_exact(corpus: Corpus, sources: list[Source]) -> None:
    """Every source is its document's text at its offsets, no header, trimmed; in corpus order, apart."""
    assert sources, "something was cited"
    order = [doc.name for doc in corpus]
    for s in sources:
        assert corpus[s.name].text[s.start : s.end] == s.text == s.text.strip()
        assert "Document: " not in s.text and s.metadata is corpus[s.name].metadata
    keys = [(order.index(s.name), s.start, s.end) for s in sources]
    assert keys == sorted(keys)
    assert all(a[0] != b[0] or a[2] < b[1] for a, b in itertools.pairwise(keys)), "merged where they touch"


def test_past_the_window_bm25_cites_the_document_that_shares_the_rare_words(engine, long_corpus) -> None:
    assert engine.count_tokens(long_corpus.text) > engine.context_window, "past the window: BM25 passages decide"
    answer = ask_corpus(engine, long_corpus, QUESTION, max_new_tokens=2)
    assert_exact(long_corpus, answer.sources)
    cited = " ".join(s.text for s in answer.sources if s.name == "b.txt")
    assert "quillwort zephyrine marmalade" in cited
    assert answer.info.mode == "query_aware" and answer.info.cache_source == "computed"
    assert answer.info.output_tokens == 2 and answer.info.total_seconds >= answer.info.compress_seconds > 0


def test_past_the_window_a_kept_passage_rereads_its_documents_header(engine, long_corpus) -> None:
    """The re-read's kept tokens (``stream_corpus``'s ``compress_span``) hold the ``Document:`` line of
    every document a kept passage starts in, so the model reads which document it is in."""
    layout = engine.layout(QUESTION, "query_aware")
    text = long_corpus.text
    found = engine.compress_span(layout.prefix, text, layout.suffix, question=QUESTION, mode="query_aware")
    offsets = engine.token_offsets(text)
    kept = found.document.origin[found.document.origin >= 0].unique()
    breaks = (kept[1:] != kept[:-1] + 1).nonzero()[:, 0] + 1
    firsts = [int(offsets[run[0], 0]) for run in torch.tensor_split(kept, breaks)]  # each kept run's first char
    named = set()
    for doc, (start, end) in zip(long_corpus, long_corpus.spans, strict=True):
        if not any(start <= first < end for first in firsts):
            continue  # no kept run starts in this document's text
        line = text.rindex(HEADER.format(name=doc.name), 0, start)
        header = ((offsets[:, 0] < line + len(f"Document: {doc.name}")) & (offsets[:, 1] > line)).nonzero()[:, 0]
        assert set(header.tolist()) <= set(kept.tolist()), f"{doc.name}'s header is re-read with its passage"
        named.add(doc.name)
    assert "b.txt" in named, "the passage with the rare words is kept, under its header"
    assert found.document.num_tokens <= 128


def test_within_the_window_the_sources_are_exact_and_the_tier_is_reused(engine, novel) -> None:
    corpus = Corpus(short_texts(novel))
    assert engine.count_tokens(corpus.text) < engine.context_window
    first = stream_corpus(engine, corpus, QUESTION, max_new_tokens=2)
    assert_exact(corpus, first.sources)  # known before the first piece
    pieces = list(first)
    assert len(pieces) >= 1 and first.info.cache_source == "computed"
    again = ask_corpus(engine, corpus, "Who signed it?", max_new_tokens=2)
    assert_exact(corpus, again.sources)
    assert again.info.cache_source == "memory", "one leaf tier for the corpus, replayed per question"


def test_the_corpus_lays_out_named_documents_in_one_text() -> None:
    corpus = Corpus([NamedText("one", "First text.", {"k": 1}), ("two", "\nSecond text.\n")])
    assert corpus.text == "Document: one\n\nFirst text.\n\nDocument: two\n\n\nSecond text.\n"
    assert [corpus.text[a:b] for a, b in corpus.spans] == ["First text.", "\nSecond text.\n"]
    assert len(corpus) == 2 and corpus["one"].metadata == {"k": 1} and HEADER.format(name="one") in corpus.text
    assert document_name({"source": "x.pdf"}, 0) == "x.pdf" and document_name({}, 2) == "document 3"
    assert document_name({"file_name": "f", "source": ""}, 0, ("source", "file_name")) == "f"


def test_citing_cuts_ranges_to_documents_merges_them_and_drops_headers() -> None:
    corpus = Corpus({"one": "alpha beta", "two": "gamma delta"})
    (a, b), (c, d) = corpus.spans
    sources = corpus.cite([(c + 6, d), (0, c + 5), (a, a + 5), (a + 5, a + 6)])
    assert [(s.name, s.start, s.end, s.text) for s in sources] == [
        ("one", 0, 10, "alpha beta"),
        ("two", 0, 5, "gamma"),
        ("two", 6, 11, "delta"),
    ]
    assert corpus.cite([(b, c)]) == [], "the separator and header alone cite nothing"
    assert corpus.cite([(a + 5, a + 6)]) == [], "whitespace alone is no source"


def test_kept_ranges_are_the_runs_of_consecutive_document_tokens() -> None:
    offsets = torch.tensor([[0, 3], [3, 6], [7, 9], [9, 12], [13, 15]])
    origin = torch.tensor([-1, 0, 1, 3, 4, -1])
    assert kept_ranges(origin, offsets) == [(0, 6), (9, 15)]
    assert kept_ranges(torch.tensor([-1, -1]), offsets) == []


def test_from_paths_names_each_file_by_its_path_under_their_common_folder(tmp_path: Path) -> None:
    (tmp_path / "deeds" / "old").mkdir(parents=True)
    (tmp_path / "deeds" / "lease.txt").write_text("A lease.")
    (tmp_path / "deeds" / "old" / "lease.txt").write_text("An older lease.")
    (tmp_path / "deeds" / "notes.bin").write_bytes(b"\x00\x01")  # not a supported type: passed over
    corpus = Corpus.from_paths([tmp_path / "deeds"])
    assert [(d.name, d.text) for d in corpus] == [("lease.txt", "A lease."), ("old/lease.txt", "An older lease.")]
    assert corpus["lease.txt"].metadata["file_name"] == "lease.txt"
    single = Corpus.from_paths(tmp_path / "deeds" / "old" / "lease.txt")
    assert [d.name for d in single] == ["lease.txt"]
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(DocumentError, match="empty"):
        Corpus.from_paths([tmp_path / "empty.txt"])
    (tmp_path / "nothing").mkdir()
    with pytest.raises(ValueError, match="no supported documents"):
        Corpus.from_paths([tmp_path / "nothing"])


@pytest.mark.parametrize(
    ("documents", "error", "match"),
    [
        ({}, ValueError, "no documents"),
        ([("a", "x"), ("a", "y")], ValueError, "two documents are named 'a'"),
        ({"a": " \n"}, ValueError, "document 'a' is empty"),
        ({"": "x"}, ValueError, "one non-empty line"),
        ({"a\nb": "x"}, ValueError, "one non-empty line"),
        ({"a": b"x"}, TypeError, "must be text"),
    ],
)
def test_a_bad_corpus_is_refused_clearly(documents, error, match) -> None:
    with pytest.raises(error, match=match):
        Corpus(documents)


def test_a_bad_question_or_option_is_refused_before_any_work(engine, novel) -> None:
    corpus = Corpus({"a": novel[40_000:40_600], "b": RARE})  # within the window: a first question builds a tier
    before = engine.stats().computations
    for question in ("", "  "):
        with pytest.raises(ValueError, match="question is empty"):
            ask_corpus(engine, corpus, question)
    with pytest.raises(ValueError, match="max_new_tokens"):
        ask_corpus(engine, corpus, QUESTION, max_new_tokens=0)
    assert engine.stats().computations == before


def test_the_joined_text_is_tokenized_once_for_every_question(engine, novel, monkeypatch) -> None:
    from homer_integrations.engine import prompting

    calls: list[str] = []
    tokenize = prompting.encode_offsets
    monkeypatch.setattr(prompting, "encode_offsets", lambda tok, text: calls.append(text) or tokenize(tok, text))
    corpus = Corpus({"p": novel[50_000:50_500], "q": novel[51_000:51_500]})
    for question in (QUESTION, "Who is there?", "What happened?"):
        ask_corpus(engine, corpus, question, max_new_tokens=1)
    assert calls.count(corpus.text) == 1, "the offsets cited are the compression's own, remembered"
