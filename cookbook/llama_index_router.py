"""LlamaIndex + HOMER: route each question to the whole document (HOMER) or to BM25 retrieval.

Offline, on the package's default model (Qwen2.5-Coder-1.5B) and an excerpt of the bundled Pride and
Prejudice, kept whole (``mode="auto"``; ``--model`` and ``--mode`` pick others).
``HomerRouterQueryEngine`` is a ``RouterQueryEngine`` over ``HomerQueryEngine`` and a BM25
``RetrieverQueryEngine``; its selector runs the routing strategies shared with LangChain:
``rules`` (whole-document questions to HOMER, the rest to retrieval) and ``self_route``
(retrieval first, HOMER when the model says the excerpts cannot answer).

    .venv/bin/python cookbook/llama_index_router.py [--tokens 3000] [--model NAME] [--mode MODE]

Output (also saved to cookbook/outputs/llama_index_router.txt): which route each question
took, why, how long it took, and the answer.
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
from llama_index.core.schema import Document

from homer_integrations.llama_index import HomerLLM, HomerRouterQueryEngine
from homer_integrations.paths import bundled_excerpt

OUTPUT = Path(__file__).parent / "outputs" / "llama_index_router.txt"
QUESTIONS = [
    "Summarize what happens in these chapters.",
    "What are the main themes of the text?",
    "Who has taken Netherfield Park?",
    "How much money a year does Mr. Bingley have?",
    "What is the capital of Peru?",
]


def run(args: argparse.Namespace) -> None:
    llm = HomerLLM(model=args.model, num_output=args.max_new_tokens, mode=args.mode)
    engine = llm.engine
    text = bundled_excerpt(engine.tokenizer, args.tokens)
    doc = Document(text=text, id_="pride-and-prejudice-opening")
    tokens = engine.prompting.count_tokens(text)
    print(f"model {llm.metadata.model_name}; document {tokens} tokens; BM25 over 256-token chunks\n")

    for strategy in ("rules", "self_route"):
        router = HomerRouterQueryEngine.from_documents([doc], llm, strategy=strategy)
        print(f"== strategy: {strategy}")
        for question in QUESTIONS:
            started = time.perf_counter()
            response = router.query(question)
            seconds = time.perf_counter() - started
            meta = response.metadata
            print(f"Q: {question}")
            print(f"   route {meta['route']} ({meta['route_reason']}); {seconds:.1f}s")
            print(f"A: {' '.join(str(response).split())}")
        print()

    stats = engine.document_cache.stats()
    print(f"compressions of the document: {stats.computations} (every HOMER answer after the first reused the cache)")


if __name__ == "__main__":
    cookbook_main(run, OUTPUT, __doc__, max_new_tokens=32)
