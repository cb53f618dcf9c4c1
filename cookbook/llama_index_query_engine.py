"""LlamaIndex + HOMER: many questions about one long document, compressed once.

Offline, on the package's default model (Qwen2.5-Coder-1.5B) and an excerpt of the bundled Pride and
Prejudice (``--model`` picks another). ``HomerQueryEngine`` prefills the whole excerpt on the first query
(``mode="auto"``: it fits the window; ``--mode`` picks another) and answers every later one from that kept
cache; then LlamaIndex's own response synthesizer hands the whole text to ``HomerLLM`` in
its QA template, and the same cache answers again.

    .venv/bin/python cookbook/llama_index_query_engine.py [--tokens 3000] [--model NAME] [--mode MODE]

Output (also saved to cookbook/outputs/llama_index_query_engine.txt): each answer as it
streams, where its cache came from, and the times.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads: idle threads yield the CPU

sys.path.insert(0, str(Path(__file__).parent))
from _common import cookbook_main  # the cookbooks' options and transcript
from llama_index.core import get_response_synthesizer
from llama_index.core.prompts.default_prompts import DEFAULT_TEXT_QA_PROMPT
from llama_index.core.schema import Document, NodeWithScore

from homer_integrations.llama_index import HomerLLM, HomerQueryEngine
from homer_integrations.paths import bundled_excerpt

OUTPUT = Path(__file__).parent / "outputs" / "llama_index_query_engine.txt"
QUESTIONS = [
    "Who has taken Netherfield Park?",
    "What does Mrs. Bennet want from her husband?",
    "How many daughters do Mr. and Mrs. Bennet have?",
    "Which daughter does Mr. Bennet like best, and why?",
    "What is Mr. Bingley like?",
]


def run(args: argparse.Namespace) -> None:
    llm = HomerLLM(model=args.model, num_output=args.max_new_tokens, mode=args.mode)
    engine = llm.engine
    text = bundled_excerpt(engine.tokenizer, args.tokens)
    doc = Document(text=text, id_="pride-and-prejudice-opening", metadata={"title": "Pride and Prejudice"})
    print(
        f"model {llm.metadata.model_name}; window {llm.metadata.context_window} tokens; HOMER max_chunk_len "
        f"{engine.config.max_chunk_len}"
    )
    print(f"document: {engine.prompting.count_tokens(text)} tokens of Pride and Prejudice (chapters 1-3)\n")

    query_engine = HomerQueryEngine([doc], llm, streaming=True)
    for question in QUESTIONS:
        print(f"Q: {question}")
        print("A: ", end="")
        started = time.perf_counter()
        response = query_engine.query(question)
        for piece in response.response_gen:
            print(piece, end="")
        stats = response.source_nodes[0].node.metadata["homer"]
        print(
            f"\n   [cache {stats['cache_source']}; {stats['document_tokens']} document tokens -> "
            f"{stats['cache_tokens']} cached; first token {stats['time_to_first_token']:.1f}s; "
            f"total {time.perf_counter() - started:.1f}s]\n"
        )

    print("LlamaIndex's own synthesizer, handing the whole text to HomerLLM in its QA template:")
    # The plain QA template keeps the chat template's head unchanged, so the prompt maps onto the
    # cache above. (The default chat QA template adds its own system message, which is part of
    # the compressed prefix: that costs one more compression, shared by all its later questions.)
    synthesizer = get_response_synthesizer(
        llm=HomerLLM(engine=engine, num_output=args.max_new_tokens, context_window=1_000_000, mode=args.mode),
        response_mode="compact",
        text_qa_template=DEFAULT_TEXT_QA_PROMPT,
    )
    question = "Who is Mr. Bennet's wife?"
    before = engine.document_cache.stats().computations
    started = time.perf_counter()
    answer = synthesizer.synthesize(question, nodes=[NodeWithScore(node=doc)])
    reused = engine.document_cache.stats().computations == before
    how = "found in the prompt; its cache reused" if reused else "found in the prompt and compressed"
    print(
        f"Q: {question}\nA: {str(answer).strip()}\n   [{time.perf_counter() - started:.1f}s: the document was {how}]\n"
    )

    stats = engine.document_cache.stats()
    print(
        f"compressions: {stats.computations} for {len(QUESTIONS) + 1} questions "
        f"(cache hits in memory: {stats.hits_memory})"
    )


if __name__ == "__main__":
    cookbook_main(run, OUTPUT, __doc__, max_new_tokens=40)
