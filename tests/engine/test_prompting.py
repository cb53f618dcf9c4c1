"""``Prompting``: a document's token ids are remembered across the questions asked of it."""

from homer_integrations import HomerConfig
from homer_integrations.engine.prompting import DOCUMENTS_REMEMBERED, Prompting
from homer_integrations.homer.document.prompt import PromptText, encode


def test_a_documents_ids_are_tokenized_once_and_handed_out_as_copies(tokenizer, text):
    prompting = Prompting(tokenizer, HomerConfig(max_chunk_len=128), num_layers=6, context_window=2048)
    _, first, _ = prompting.encode_span("Read:", text, "")
    first[:] = 0  # a caller that writes into its ids must not change what the next question gets
    _, second, _ = prompting.encode_span("Read:", text, "Who?")
    assert second.tolist() == encode(tokenizer, text).tolist()
    assert prompting.documents.ids.cache_info().hits == 1, "the second question did not re-tokenize"
    for i in range(DOCUMENTS_REMEMBERED):
        prompting.encode_span("", f"{i} {text}", "")
    prompting.encode_span("", text, "")
    assert prompting.documents.ids.cache_info().misses == DOCUMENTS_REMEMBERED + 2, "only the latest are kept"


def test_marked_up_documents_are_not_remembered_by_their_text(tokenizer):
    prompting = Prompting(tokenizer, HomerConfig(max_chunk_len=128), num_layers=6, context_window=2048)
    marked = PromptText([("<|im_start|>", True)])
    plain = str(marked)
    assert encode(tokenizer, marked).tolist() != encode(tokenizer, plain).tolist(), "markup changes the ids"
    assert prompting.encode_span("", plain, "")[1].tolist() == encode(tokenizer, plain).tolist()
    assert prompting.encode_span("", marked, "")[1].tolist() == encode(tokenizer, marked).tolist()
    assert prompting.documents.ids.cache_info().currsize == 1
