"""LangChain + HOMER: an unchanged "stuff the document into the prompt" QA chain, one compression.

Offline, on the package's default model (Qwen2.5-Coder-1.5B) and an excerpt of the bundled Pride and
Prejudice, kept whole (``mode="auto"``: it fits the window; ``--model`` and ``--mode`` pick others). The
LCEL chain ``prompt | ChatHomer`` gets the whole excerpt in ``{context}`` on every question:
the first call finds the document in the prompt and prefills it once, every later call finds the
same text and reads the kept cache. Then a follow-up turn in the same conversation, and the text
LLM in LangChain's stuff-documents chain over a file loaded whole by ``HomerDocumentLoader``.

    .venv/bin/python cookbook/langchain_qa.py [--tokens 3000] [--model NAME] [--mode MODE]

Output (also saved to cookbook/outputs/langchain_qa.txt): each answer as it streams, its token
usage (cache creation / cache read) and how long it took.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads: idle threads yield the CPU

sys.path.insert(0, str(Path(__file__).parent))
from _common import cookbook_main, opening  # the cookbooks' options, transcript and excerpt
from langchain_core.messages import AIMessageChunk, HumanMessage
from langchain_core.prompts import ChatPromptTemplate, PromptTemplate

from homer_integrations.langchain import ChatHomer, HomerDocumentLoader, HomerLLM

OUTPUT = Path(__file__).parent / "outputs" / "langchain_qa.txt"
QUESTIONS = [
    "Who has taken Netherfield Park?",
    "What does Mrs. Bennet want from her husband?",
    "How many daughters do Mr. and Mrs. Bennet have?",
    "Which daughter does Mr. Bennet like best?",
    "What is Mr. Bingley like?",
]
PROMPT = ChatPromptTemplate.from_messages(
    [("human", "Answer the question using the text below.\n\n{context}\n\nQuestion: {question}\nAnswer briefly.")]
)


def report(message: AIMessageChunk, seconds: float) -> str:
    usage = message.usage_metadata
    details = usage["input_token_details"]
    homer = message.response_metadata["homer"]
    return (
        f"   [{seconds:.1f}s; document {homer['document_found_by']}, cache {homer['cache_source']}; "
        f"input {usage['input_tokens']} tokens = cache creation {details['cache_creation']} + "
        f"cache read {details['cache_read']} + {usage['input_tokens'] - sum(details.values())} fed after]"
    )


def ask(chain, inputs, label: str) -> AIMessageChunk:
    print(f"Q: {label}\nA: ", end="")
    started = time.perf_counter()
    full = None
    for chunk in chain.stream(inputs):
        print(chunk.text, end="")
        full = chunk if full is None else full + chunk
    print("\n" + report(full, time.perf_counter() - started) + "\n")
    return full


def run(args: argparse.Namespace) -> None:
    chat = ChatHomer(model=args.model, max_tokens=args.max_new_tokens, mode=args.mode)
    engine = chat.resolve_engine()
    book = opening(engine.tokenizer, args.tokens)
    print(f"model {chat.model_name}; HOMER max_chunk_len {engine.config.max_chunk_len}")
    print(f"document: {engine.prompting.count_tokens(book)} tokens of Pride and Prejudice (from chapter 1)\n")

    chain = PROMPT | chat
    print("== LCEL chain: prompt | ChatHomer, the whole text in {context} every time ==\n")
    first = None
    for question in QUESTIONS:
        answer = ask(chain, {"context": book, "question": question}, question)
        first = first or answer

    print("== A follow-up turn: the conversation history goes after the cached document ==\n")
    history = [*PROMPT.format_messages(context=book, question=QUESTIONS[0]), first, HumanMessage("Is he rich?")]
    ask(chat, history, "Is he rich? (after the first question and its answer)")

    print("== HomerLLM in LangChain's stuff-documents chain, over a file loaded whole ==\n")
    try:
        from langchain_classic.chains.combine_documents import create_stuff_documents_chain
    except ImportError:
        print("(skipped: pip install langchain-classic)\n")
    else:
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "pride-and-prejudice-opening.txt"
            path.write_text(book, encoding="utf-8")
            docs = HomerDocumentLoader(path).load()
        template = PromptTemplate.from_template(
            "Answer the question from the context.\n\nContext:\n{context}\n\nQuestion: {question}\nAnswer:"
        )
        stuff = create_stuff_documents_chain(
            HomerLLM(engine=engine, max_tokens=args.max_new_tokens, mode=args.mode), template
        )
        question = "Who is Mr. Bennet's wife?"
        started = time.perf_counter()
        answer = stuff.invoke({"context": docs, "question": question})
        seconds = time.perf_counter() - started
        source = docs[0].metadata["file_name"]
        print(f"Q: {question}\nA: {answer.strip()}\n   [{seconds:.1f}s; loaded whole from {source}]\n")

    stats = engine.document_cache.stats()
    print(f"compressions: {stats.computations} for {len(QUESTIONS) + 2} questions (memory hits: {stats.hits_memory})")


if __name__ == "__main__":
    cookbook_main(run, OUTPUT, __doc__, max_new_tokens=40)
