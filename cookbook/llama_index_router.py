"""LlamaIndex + HOMER: route each question to the whole document (HOMER) or to BM25 retrieval.

Offline, on the embedded default model and an excerpt of the bundled Pride and Prejudice.
``HomerRouterQueryEngine`` is a ``RouterQueryEngine`` over ``HomerQueryEngine`` and a BM25
``RetrieverQueryEngine``; its selector runs the routing strategies shared with LangChain:
``rules`` (whole-document questions to HOMER, the rest to retrieval) and ``self_route``
(retrieval first, HOMER when the model says the excerpts cannot answer). The 135M default
model almost never admits that it cannot answer, so here self-route stays on retrieval; a
larger model (``--model``) declines more often and falls back to HOMER.

    .venv/bin/python cookbook/llama_index_router.py [--tokens 3000] [--model NAME]

Output (also saved to cookbook/outputs/llama_index_router.txt): which route each question
took, why, how long it took, and the answer.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads: idle threads yield the CPU

from llama_index.core.schema import Document

from homer_integrations.llama_index import HomerLLM, HomerRouterQueryEngine
from homer_integrations.paths import bundled_text

OUTPUT = Path(__file__).parent / "outputs" / "llama_index_router.txt"
QUESTIONS = [
    "Summarize what happens in these chapters.",
    "What are the main themes of the text?",
    "Who has taken Netherfield Park?",
    "How much money a year does Mr. Bingley have?",
    "What is the capital of Peru?",
]
lines: list[str] = []


def say(text: str = "") -> None:
    print(text, flush=True)
    lines.append(text + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=3000, help="length of the excerpt in model tokens")
    parser.add_argument("--model", default=None, help="local path, hub id or embedded name (default: embedded)")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    args = parser.parse_args()

    llm = HomerLLM(model=args.model, num_output=args.max_new_tokens)
    engine = llm.engine
    novel = bundled_text("prideprejudice")
    start = novel.index("It is a truth universally acknowledged")
    text = engine.tokenizer.decode(engine.token_ids(novel[start:])[: args.tokens])
    doc = Document(text=text, id_="pride-and-prejudice-opening")
    say(f"model {llm.metadata.model_name}; document {engine.count_tokens(text)} tokens; BM25 over 256-token chunks\n")

    for strategy in ("rules", "self_route"):
        router = HomerRouterQueryEngine.from_documents([doc], llm, strategy=strategy)
        say(f"== strategy: {strategy}")
        for question in QUESTIONS:
            started = time.perf_counter()
            response = router.query(question)
            seconds = time.perf_counter() - started
            meta = response.metadata
            say(f"Q: {question}")
            say(f"   route {meta['route']} ({meta['route_reason']}); {seconds:.1f}s")
            say(f"A: {' '.join(str(response).split())}")
        say()

    stats = engine.document_cache.stats()
    say(f"compressions of the document: {stats.computations} (every HOMER answer after the first reused the cache)")
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    OUTPUT.write_text("".join(lines), encoding="utf-8")


if __name__ == "__main__":
    main()
