"""HomerModel behaviour on a tiny random-weight model with the real SmolLM2 tokenizer."""

import pytest
import torch
from pydantic import ValidationError

from homer_integrations import HomerConfig, HomerModel
from homer_integrations.engine.loading import EMBEDDED_MODELS, embedded_defaults
from homer_integrations.homer.config import ModelDefaults
from homer_integrations.homer.document.prompt import encode
from homer_integrations.homer.reading.strategies import Recipe
from homer_integrations.paths import PACKAGE_DATA
from tests.conftest import tiny_model


@pytest.fixture(scope="module")
def engine(tokenizer, tmp_path_factory):
    """Answers from the shared root (pinned: the default is ``query_aware``): these tests reuse one root."""
    cfg = HomerConfig(max_chunk_len=128, warmup_layers=3, mode="shared")
    return HomerModel(
        tiny_model("llama"),
        tokenizer,
        cfg,
        calibration_dir=tmp_path_factory.mktemp("calib"),
        progress=False,
        recipe=Recipe(calibration_segments=2),
    )


@pytest.fixture(scope="module")
def long_text(novel):
    return novel[:6000]  # ~1.5k tokens: a tree of several levels at max_chunk_len 128


def test_compress_statistics(engine, long_text):
    doc = engine.compress(long_text)
    s = doc.stats
    assert s.document_tokens == engine.prompting.count_tokens(long_text)
    assert s.cache_tokens == doc.num_tokens <= 128
    assert s.tree_height >= 3 and s.leaves == 2**s.tree_height
    assert s.cache_bytes == doc.nbytes > 0 and s.peak_kv_bytes > 0 and s.seconds > 0
    assert engine.compress(long_text) is doc, "a second compress is a cache hit"


def test_stats_count_the_engine_cache_and_another_store_leaves_it_alone(engine, long_text, tmp_path):
    from homer_integrations.cache import DocumentCache

    engine.compress(long_text)
    before = engine.stats()
    engine.compress(long_text)
    after = engine.stats()
    assert after.hits_memory == before.hits_memory + 1 and after.computations == before.computations
    assert after.entries >= 1 and after.memory_bytes > 0

    other = engine.with_store(DocumentCache(tmp_path))
    assert other.document_cache is not engine.document_cache and other.tiers.keys is engine.tiers.keys
    other.compress(long_text)
    assert other.stats().computations == 1 and other.stats().disk_entries == 1
    assert engine.stats().computations == after.computations, "the first engine's cache saw nothing"


def test_stored_cache_is_never_mutated(engine, long_text):
    doc = engine.compress(long_text)
    snapshot = [t.clone() for t in doc.keys + doc.values]
    alone_a = engine.answer(doc, "Who is Mr. Darcy?", max_new_tokens=8)
    alone_b = engine.answer(doc, "Where is Netherfield?", max_new_tokens=8)
    again_a = engine.answer(long_text, "Who is Mr. Darcy?", max_new_tokens=8)
    assert again_a == alone_a
    assert engine.answer(doc, "Where is Netherfield?", max_new_tokens=8) == alone_b
    assert all(torch.equal(a, b) for a, b in zip(snapshot, doc.keys + doc.values, strict=True))


def test_stream_pieces_join_to_the_answer_and_info_is_filled(engine, long_text):
    stream = engine.run(long_text, "Tell me about Elizabeth.", max_new_tokens=12)
    pieces = list(stream)
    assert "".join(pieces) == engine.answer(long_text, "Tell me about Elizabeth.", max_new_tokens=12)
    info = stream.info
    assert info.cache_source in {"memory", "computed"}
    assert info.output_tokens >= 1 and info.finish_reason in {"eos", "length", "stop"}
    assert info.cache_tokens <= 128 and info.document_tokens > info.cache_tokens
    assert info.time_to_first_token is not None and info.total_seconds >= info.time_to_first_token


def test_sampling_is_reproducible_with_a_seed(engine, long_text):
    def ask(seed):
        return engine.answer(long_text, "Say something.", max_new_tokens=10, temperature=1.0, seed=seed)

    assert ask(1) == ask(1)
    assert len({ask(s) for s in range(4)}) > 1


def test_stop_strings_are_cut(engine, long_text):
    full = engine.answer(long_text, "Continue.", max_new_tokens=16)
    assert len(full) > 4
    stop = full[2:4]
    cut = engine.answer(long_text, "Continue.", max_new_tokens=16, stop=(stop,))
    assert cut == full[: full.index(stop)]


@pytest.mark.parametrize("reask", [True, False])
def test_query_aware_mode_binds_the_question(tokenizer, tmp_path, long_text, reask):
    cfg = HomerConfig(max_chunk_len=128, warmup_layers=3, mode="query_aware")
    recipe = Recipe(calibration_segments=2, reask_question=reask)
    qa = HomerModel(tiny_model("llama"), tokenizer, cfg, calibration_dir=tmp_path, progress=False, recipe=recipe)
    with pytest.raises(ValueError, match="question"):
        qa.compress(long_text, mode="query_aware")
    assert qa.compress(long_text).question is None, "no question: the shared root"
    doc = qa.compress(long_text, question="Who?")
    assert doc.question == "Who?"
    # the paper answers from the root's last logits; re-asking feeds the question after the cache
    assert (doc.next_token_logits is None) == reask
    assert ("Who?" in qa.prompting.layout("Who?").continuation) == reask
    stream = qa.run(doc, "Who?", max_new_tokens=4)
    assert stream.text() == qa.answer(long_text, "Who?", max_new_tokens=4)
    assert (stream.info.input_tokens > 0) == reask
    with pytest.raises(ValueError, match="another question"):
        qa.answer(doc, "Where?")


def test_bad_inputs_get_clear_errors(engine, tokenizer):
    with pytest.raises(ValueError, match="empty"):
        engine.answer("", "Why?")
    with pytest.raises(ValueError, match="empty"):
        engine.answer("   \n ", "Why?")
    with pytest.raises(ValueError, match="question is empty"):
        engine.answer("Some text.", " ")
    with pytest.raises(ValidationError, match="max_new_tokens"):
        engine.answer("Some text.", "Why?", max_new_tokens=0)
    with pytest.raises(ValidationError, match="unknown"):
        engine.answer("Some text.", "Why?", unknown=1)
    with pytest.raises(ValueError, match="warmup_layers"):
        HomerModel(tiny_model("llama"), tokenizer, HomerConfig(warmup_layers=6), progress=False)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        HomerModel(tiny_model("llama"), tokenizer, HomerConfig(max_chunk_len=4096), progress=False)
    with pytest.raises(ValidationError, match="mode"):
        HomerConfig(mode="fast")


def test_cache_key_changes_with_every_component(engine, tokenizer, tmp_path):
    base = engine.tiers.keys.root("p", "doc", "s")
    assert engine.tiers.keys.root("p", "doc", "s") == base
    assert (
        len(
            {
                base,
                engine.tiers.keys.root("P", "doc", "s"),
                engine.tiers.keys.root("p", "doc2", "s"),
                engine.tiers.keys.root("p", "doc", "S"),
            }
        )
        == 4
    )
    other_settings = HomerModel(
        tiny_model("llama"), tokenizer, HomerConfig(max_chunk_len=128, warmup_layers=2), progress=False
    )
    other_weights = HomerModel(
        tiny_model("llama", seed=1), tokenizer, HomerConfig(max_chunk_len=128, warmup_layers=3), progress=False
    )
    other_mode = HomerModel(
        tiny_model("llama"),
        tokenizer,
        HomerConfig(max_chunk_len=128, warmup_layers=3, mode="query_aware"),
        progress=False,
    )
    keys = {m.tiers.keys.root("p", "doc", "s") for m in (other_settings, other_weights, other_mode)}
    assert base not in keys and len(keys) == 3


@pytest.mark.real_model
def test_single_chunk_document_answers_like_plain_generate(smol_engine):
    doc = "Alice has a red bicycle. Bob owns a blue car. The meeting is on Tuesday at 3pm in room 42."
    q = "In which room is the meeting?"
    stream = smol_engine.run(doc, q, max_new_tokens=20)
    answer = stream.text()
    assert stream.info.compression.tree_height == 0
    lay = smol_engine.prompting.layout(q)
    tok = smol_engine.tokenizer
    # the same token ids HOMER sees: each span is tokenized on its own
    ids = torch.cat(
        [encode(tok, lay.prefix, first=True), encode(tok, doc), encode(tok, lay.suffix), encode(tok, lay.continuation)]
    )[None]
    out = smol_engine.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=20, do_sample=False)
    assert answer == tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
    assert "42" in answer


def test_model_defaults_set_the_final_cache_length_within_the_chunk():
    defaults = ModelDefaults(max_chunk_len=256, warmup_layers=3, final_cache_len=128)
    assert HomerConfig().resolve(4, 2048, defaults).final_cache_len == 128
    assert HomerConfig(final_cache_len=200).resolve(4, 2048, defaults).final_cache_len == 200
    assert HomerConfig(max_chunk_len=96).resolve(4, 2048, defaults).final_cache_len == 96, "capped at the chunk"
    no_final = ModelDefaults(max_chunk_len=256, warmup_layers=3)
    assert HomerConfig().resolve(4, 2048, no_final).final_cache_len == 256


def test_every_embedded_model_ships_the_calibration_for_its_chunk_length():
    from safetensors import safe_open

    shipped = set()
    for path in (PACKAGE_DATA / "calibration").glob("*.safetensors"):
        with safe_open(str(path), "pt") as f:
            shipped.add(int(f.metadata()["max_chunk_len"]))
    for spec in EMBEDDED_MODELS.values():
        assert spec.max_chunk_len in shipped, spec.name
        defaults = embedded_defaults(spec.name)
        assert defaults.final_cache_len == spec.final_cache_len
