"""``kept`` mode: as much of a document as the window holds, kept once, then each question read after it."""

from __future__ import annotations

from homer_integrations import HomerConfig, HomerModel
from homer_integrations.engine.modes import KEPT_FORMS, KeptWindow
from homer_integrations.homer.reading.strategies import Recipe
from tests.conftest import mode_engine, tiny_model


def test_past_the_window_a_window_sized_root_is_kept_and_each_question_reads_its_passages(
    tokenizer, calibration, novel
) -> None:
    book = novel[20_000:32_000]  # about 2,700 tokens: past the tiny model's 2,048-token window
    engine = mode_engine(tokenizer, calibration)  # max_chunk_len 128
    assert engine.tiers.window_root.tokens == 1024, "half the window"
    first = engine.run(book, "Who walked to Meryton?", mode="kept", max_new_tokens=2)
    first.text()
    root = engine.compress(book, mode="kept")
    kept = root.origin[root.origin >= 0]
    assert first.info.mode == "kept" and first.info.cache_source == "computed"
    assert 700 <= kept.numel() <= 1.5 * 1024, "about half the window, not one chunk's 128"
    question_only = engine.count_tokens("Who walked to Meryton?")
    assert first.info.input_tokens > question_only + 300, "the question's passages are read after the root"
    later = engine.run(book, "What did Elizabeth say?", mode="kept", max_new_tokens=2)
    later.text()
    assert later.info.cache_source == "memory" and engine.stats().computations == 1, "one root for every question"
    shared = engine.entry_key(book, "shared")
    assert engine.entry_key(book, "kept") not in (shared, engine.entry_key(book, "full"))


def test_the_passages_read_are_the_ones_bm25_ranks_best_in_document_order(tokenizer, calibration, novel) -> None:
    book = novel[20_000:32_000]
    engine = mode_engine(tokenizer, calibration)
    passages = engine.tiers.passages("", book, "Meryton", 200)
    assert "Meryton" in passages and engine.count_tokens(passages) <= 200 + 8
    runs = passages.split("\n\n")
    assert [book.index(r[:40]) for r in runs] == sorted(book.index(r[:40]) for r in runs), "document order"
    form = KEPT_FORMS["kept"]
    read = form.read_before(engine.tiers, "", book, "Who walked to Meryton?")
    assert read.startswith(KeptWindow.HEADER) and read.endswith(KeptWindow.FOOTER) and "Meryton" in read
    assert form.read_before(engine.tiers, "", book[:3000], "Who walked to Meryton?") == "", "kept whole: no passages"


def test_within_the_window_kept_is_the_whole_prefill(tokenizer, calibration, novel) -> None:
    short = novel[20_000:23_000]
    engine = mode_engine(tokenizer, calibration)
    assert engine.entry_key(short, "kept") == engine.entry_key(short, "full")
    stream = engine.run(short, "Who walked to Meryton?", mode="kept", max_new_tokens=2)
    stream.text()
    assert stream.info.mode == "kept" and stream.info.input_tokens < 40, "the question alone is read"
    assert engine.compress(short, mode="full").num_tokens == engine.compress(short, mode="kept").num_tokens


def test_a_new_engine_reads_the_kept_root_back_from_the_store(tokenizer, calibration, novel, tmp_path) -> None:
    book = novel[20_000:32_000]

    def engine() -> HomerModel:
        cfg = HomerConfig(max_chunk_len=128, warmup_layers=3)
        recipe = Recipe(calibration_segments=2)
        return HomerModel(
            tiny_model(), tokenizer, cfg, calibration_dir=calibration, progress=False, recipe=recipe, store=tmp_path
        )

    built = engine().cache_document(book, "kept")
    again = engine().cache_document(book, "kept")
    assert built.source == "computed" and again.source == "disk"
    assert again.stats is not None and again.stats.cache_tokens == built.stats.cache_tokens > 700
