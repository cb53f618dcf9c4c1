"""LangChain + HOMER: route each question to the whole document (HOMER) or to BM25 retrieval.

Offline, on the package's default model (Qwen2.5-Coder-1.5B) and an excerpt of the bundled Pride and
Prejudice (``--model`` picks another). ``HomerRouter`` answers each question either over the whole excerpt
(kept whole by ``mode="auto"``: prefilled once, then cached; ``--mode`` picks another) or
from the best BM25 chunks in a short prompt to the same model, with three strategies: ``rules``
(whole-document questions to HOMER), ``self_route`` (retrieval first, HOMER when the model says the
chunks cannot answer) and a plain function.

    .venv/bin/python cookbook/langchain_routing.py [--tokens 3000] [--model NAME] [--mode MODE]

Output (also saved to cookbook/outputs/langchain_routing.txt): per question, the route, the
reason, the answer and the time it took.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads: idle threads yield the CPU

sys.path.insert(0, str(Path(__file__).parent))
from _common import cookbook_main, opening  # the cookbooks' options, transcript and excerpt

from homer_integrations.langchain import ChatHomer, HomerRouter

OUTPUT = Path(__file__).parent / "outputs" / "langchain_routing.txt"
RUNS = {
    "rules": [
        "Summarize the story so far.",
        "Who is Lady Lucas?",
        "What are the main themes of the text?",
        "How much is Mr. Bingley's income?",
    ],
    "self_route": ["Who is Lady Lucas?", "Who won the football match?"],
}


def by_length(question: str) -> tuple[str, str]:
    """A user routing function: long questions to HOMER, short ones to retrieval."""
    if len(question.split()) > 8:
        return "homer", f"{len(question.split())} words: a broad question"
    return "retrieval", f"{len(question.split())} words: a lookup"


def run(args: argparse.Namespace) -> None:
    chat = ChatHomer(model=args.model, max_tokens=args.max_new_tokens, mode=args.mode)
    engine = chat.resolve_engine()
    book = opening(engine.tokenizer, args.tokens)
    print(f"model {chat.model_name}; document: {engine.prompting.count_tokens(book)} tokens of Pride and Prejudice\n")
    broad = "How do the Bennet parents differ in character and in their hopes?"
    runs = {**RUNS, by_length: ["Who is Mr. Long?", broad]}
    for strategy, questions in runs.items():
        router = HomerRouter(chat, book, strategy)
        print(f"== strategy: {router.strategy.name} ==")
        for question in questions:
            started = time.perf_counter()
            answer = router.invoke(question)
            meta = answer.response_metadata
            if meta["route"] == "homer":
                where = f"cache {meta['homer']['cache_source']}"
            else:
                where = f"chunks {meta['retrieved_chunks']}"
            print(f"Q: {question}")
            print(f"   route {meta['route']} ({meta['route_reason']}); {where}; {time.perf_counter() - started:.1f}s")
            print(f"A: {answer.text.strip()}\n")
    print(f"compressions: {engine.document_cache.stats().computations} (the HOMER route reuses one cache)")


if __name__ == "__main__":
    cookbook_main(run, OUTPUT, __doc__, max_new_tokens=32)
