"""Questions only the whole document answers, and lookups, through one router in LangChain and LlamaIndex.

Offline, on the package's default model (Qwen2.5-Coder-1.5B) and the opening chapters of the bundled Pride
and Prejudice, kept whole (``mode="auto"``: prefilled once, then every HOMER answer reads after that cache).
The routers' default ``rules`` send a question about the document as a whole (a list, a count, an order,
how something changes, a comparison) to HOMER, which reads all of it, and a lookup to the BM25 chunks in a
short prompt. Every answer says where it comes from: on the HOMER route the spans of the document it
attended to most (``response_metadata["homer"]["sources"]`` in LangChain, the source nodes in LlamaIndex),
on the retrieval route the chunks it was given.

    .venv/bin/python cookbook/whole_document_questions.py [--tokens 6000] [--model NAME] [--mode MODE]

Output (also saved to cookbook/outputs/whole_document_questions.txt).
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
from llama_index.core.schema import Document

from homer_integrations.langchain import ChatHomer, HomerRouter
from homer_integrations.llama_index import HomerLLM, HomerRouterQueryEngine

OUTPUT = Path(__file__).parent / "outputs" / "whole_document_questions.txt"
QUESTIONS = [
    "How does the neighbourhood's opinion of Mr. Darcy change from his arrival at the assembly to its end?",
    "Compare how Mr. Bingley and Mr. Darcy behave at the Meryton assembly.",
    "Which of the Bennet daughters does Mr. Bingley dance with at the assembly, and how many times with each?",
    "How much money a year does Mr. Bingley have?",
    "Who has taken Netherfield Park?",
]
EXCERPT_CHARS = 90
"""Characters of a cited span shown."""


def excerpt(text: str, start: int, end: int) -> str:
    words = " ".join(text[start:end].split())
    return words if len(words) <= EXCERPT_CHARS else words[: EXCERPT_CHARS - 1] + "…"


def run(args: argparse.Namespace) -> None:
    chat = ChatHomer(model=args.model, max_tokens=args.max_new_tokens, mode=args.mode)
    engine = chat.resolve_engine()
    book = opening(engine.tokenizer, args.tokens)
    print(f"model {chat.model_name}; document: {engine.count_tokens(book)} tokens of Pride and Prejudice\n")

    print("== LangChain: HomerRouter (rules)")
    router = HomerRouter(chat, book)
    for question in QUESTIONS:
        started = time.perf_counter()
        message = router.invoke(question)
        meta = message.response_metadata
        print(f"Q: {question}\n   route {meta['route']} ({meta['route_reason']}); {time.perf_counter() - started:.1f}s")
        print(f"A: {' '.join(message.text.split())}")
        if meta["route"] == "homer":
            for s in meta["homer"]["sources"]:
                where = f"chars {s['start']:,}-{s['end']:,} ({s['score']:.0%})"
                print(f"   source {where}: {excerpt(book, s['start'], s['end'])}")
        else:
            print(f"   read chunks {meta['retrieved_chunks']}")
    print()

    print("== LlamaIndex: HomerRouterQueryEngine (rules)")
    llm = HomerLLM(model=args.model, num_output=args.max_new_tokens, mode=args.mode)
    doc = Document(text=book, id_="pride-and-prejudice-opening")
    engine_router = HomerRouterQueryEngine.from_documents([doc], llm, strategy="rules")
    for question in QUESTIONS:
        started = time.perf_counter()
        response = engine_router.query(question)
        meta = response.metadata
        print(f"Q: {question}\n   route {meta['route']} ({meta['route_reason']}); {time.perf_counter() - started:.1f}s")
        print(f"A: {' '.join(str(response).split())}")
        for n in response.source_nodes[:5]:
            node = n.node
            if node.start_char_idx is not None:
                where = f"chars {node.start_char_idx:,}-{node.end_char_idx:,}"
                print(
                    f"   source {where} ({n.score or 0:.2f}): {excerpt(book, node.start_char_idx, node.end_char_idx)}"
                )
    print(f"\nprefills of the document: {engine.document_cache.stats().computations} (one for both frameworks)")


if __name__ == "__main__":
    cookbook_main(run, OUTPUT, __doc__, max_new_tokens=64, options=(("--tokens", int, 6000, "excerpt length"),))
