"""``EncodedDocument``: one call's ids, and each unit split computed once."""

from unittest import mock

import torch

from homer_integrations import HomerConfig
from homer_integrations.engine.prompting import Prompting
from homer_integrations.homer.document import encoded as encoded_module
from homer_integrations.homer.document.prompt import encode, unit_ids, units_at


def test_a_call_encodes_its_spans_once_and_splits_each_unit_once(tokenizer, text):
    prompting = Prompting(tokenizer, HomerConfig(max_chunk_len=128), num_layers=6, context_window=2048)
    encoded = prompting.encode_document("Read:", text, "Who is she?", asks=True)
    spans = prompting.encode_span("Read:", text, "")
    assert torch.equal(encoded.prefix_ids, spans[0]) and torch.equal(encoded.document_ids, spans[1])
    assert torch.equal(encoded.suffix_ids, encode(tokenizer, "Who is she?", formatted=True))
    assert encoded.prompt_len == encoded.fixed_len + encoded.document_ids.numel()
    with (
        mock.patch.object(encoded_module, "units_at", wraps=units_at) as split,
        mock.patch.object(encoded_module, "unit_ids", wraps=unit_ids) as tokenized,
    ):
        first = encoded.units("statement")
        assert encoded.units("statement") is first and split.call_count == 1, "a unit is split once per call"
        assert encoded.units("token") is None
    assert tokenized.call_count == 0, "from the offsets of the call that gave the ids: not tokenized again"
    assert torch.equal(first, unit_ids(tokenizer, text, "statement"))


def test_units_that_do_not_line_up_with_the_ids_are_none(tokenizer, text):
    prompting = Prompting(tokenizer, HomerConfig(max_chunk_len=128), num_layers=6, context_window=2048)
    shared = prompting.encode_document("Read:", text, "Answer:")
    assert shared.units("word") is not None
    cut = type(shared)(text, shared.prefix_ids, shared.document_ids[:-1], shared.suffix_ids, tokenizer)
    assert cut.units("word") is None, "offsets that do not line up fall back to token scores"
