"""Document-text digests (``homer.model.fingerprint.TextDigests``) and the key they feed."""

from __future__ import annotations

import hashlib

from homer_integrations import HomerConfig, HomerModel
from homer_integrations.homer.model.fingerprint import TextDigests
from tests.conftest import tiny_model


def test_a_digest_is_the_texts_sha256_and_is_kept_for_the_next_call():
    digests = TextDigests(size=2)
    text = "It is a truth universally acknowledged \ud800" * 100  # a lone surrogate is kept, not an error
    digest = digests(text)
    assert digest == hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()
    assert digests("".join([text])) is digest  # an equal text built anew: found, not hashed again
    digests("b" * 300)
    digests("c" * 300)  # the least recent text goes
    assert digests(text) is not digest and digests(text) == digest


def test_cache_keys_tell_documents_apart_and_repeat_for_the_same_text(tokenizer):
    engine = HomerModel(tiny_model(), tokenizer, HomerConfig(max_chunk_len=256), model_name="tiny", progress=False)
    layout = engine.prompting.layout("")
    one = engine.tiers.keys.root(layout.prefix, "a document " * 50, layout.suffix)
    assert one == engine.tiers.keys.root(layout.prefix, "a document " * 50, layout.suffix)
    assert one != engine.tiers.keys.root(layout.prefix, "a document " * 49 + "a documenT ", layout.suffix)
    assert engine.tiers.keys.tier(layout.prefix, "a document " * 50) != one


def test_the_shipped_calibration_is_found_by_the_default_models_fingerprint(smol_parts):
    """The weights fingerprint is part of every calibration and cache key: if it changed, every
    shipped calibration and every stored entry would silently stop being found."""
    from homer_integrations.engine.loading import SMOLLM2
    from homer_integrations.homer.model.decoder import DecoderStack
    from homer_integrations.homer.scoring.calibration import CalibrationKey
    from homer_integrations.paths import PACKAGE_DATA

    model, _ = smol_parts
    key = CalibrationKey.for_stack(DecoderStack(model), SMOLLM2.max_chunk_len)
    shipped = {p.stem for p in (PACKAGE_DATA / "calibration").glob("*.safetensors")}
    assert key.id in shipped


def test_a_float_models_fingerprint_ignores_an_unset_quantization():
    from homer_integrations.homer.model.fingerprint import weights_fingerprint

    model = tiny_model()
    before = weights_fingerprint(model)
    model.config.homer_quantization = None
    assert weights_fingerprint(model) == before
    model.config.homer_quantization = "int8"
    assert weights_fingerprint(model) != before
