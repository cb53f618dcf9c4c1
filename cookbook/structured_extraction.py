"""Typed records from a whole novel: several schemas, one compression, LangChain and LlamaIndex.

Offline, on the embedded SmolLM2-135M (``--model`` picks another) and the whole bundled *Northanger
Abbey* (about 105,000 tokens). HOMER compresses the novel once into its shared root
(``mode="shared"``; ``--mode`` picks another); each schema is then one short constrained answer read
from that cache. LangChain's ``ChatHomer.with_structured_output`` extracts the first records (the
first call compresses, the next read the cache), and LlamaIndex's ``HomerQueryEngine(output_cls=)``
extracts one more from the same engine. Every answer is decoded under its JSON schema, so it always
validates, whatever the model; whether its values are *right* is checked against the book and
printed beside it: a small model reading a 100x-compressed novel gets many of them wrong.

    .venv/bin/python cookbook/structured_extraction.py [--model NAME] [--mode MODE]

Output (also saved to cookbook/outputs/structured_extraction.txt): each record as JSON, its check
against the book, where its cache came from and how long it took.
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
from langchain_core.prompts import ChatPromptTemplate
from llama_index.core import Document
from pydantic import BaseModel, Field

from homer_integrations import HomerModel
from homer_integrations.langchain import ChatHomer
from homer_integrations.llama_index import HomerLLM, HomerQueryEngine
from homer_integrations.paths import bundled_text

OUTPUT = Path(__file__).parent / "outputs" / "structured_extraction.txt"


class Heroine(BaseModel):
    """The heroine of the novel."""

    name: str = Field(description="her full name")
    home: str = Field(description="the village where her family lives")
    father_profession: str = Field(description="what her father does for a living")


class Family(BaseModel):
    """The heroine's family."""

    father: str = Field(description="her father's name")
    number_of_children: int = Field(ge=1, le=20, description="how many children her parents have")


class Friends(BaseModel):
    """The friends the heroine makes in Bath."""

    closest_friend: str = Field(description="the young woman who becomes her closest friend in Bath")
    friend_brother: str = Field(description="that friend's brother")


class Suitor(BaseModel):
    """The man the heroine comes to love."""

    name: str
    sister: str = Field(description="his sister's name")
    home: str = Field(description="the name of his father's house")


CHECKS: dict[type[BaseModel], dict[str, str]] = {
    Heroine: {"name": "catherine morland", "home": "fullerton", "father_profession": "clergy"},
    Family: {"father": "richard", "number_of_children": "10"},
    Friends: {"closest_friend": "isabella", "friend_brother": "john"},
    Suitor: {"name": "henry tilney", "sister": "eleanor", "home": "northanger"},
}
"""What the book says, as a keyword each field's value must contain (lower case)."""

PROMPT = ChatPromptTemplate.from_messages([("human", "{novel}\n\nFrom the novel above: {task} Answer in JSON.")])


def check(record: BaseModel) -> str:
    """``field ok`` / ``field WRONG (want ...)`` for each field, against ``CHECKS``."""
    wants = CHECKS[type(record)]
    marks = []
    for field, want in wants.items():
        got = str(getattr(record, field)).lower()
        marks.append(f"{field} ok" if want in got else f"{field} WRONG (book: {want})")
    return "; ".join(marks)


def show(label: str, record: BaseModel, seconds: float, source: str) -> int:
    """Print one record with its check; returns how many of its fields are right."""
    print(f"{label}\n  {record.model_dump_json()}\n  check: {check(record)}\n  [{seconds:.1f}s; cache {source}]\n")
    wants = CHECKS[type(record)]
    return sum(want in str(getattr(record, f)).lower() for f, want in wants.items())


def run(args: argparse.Namespace) -> None:
    engine = HomerModel.from_pretrained(args.model)
    config = engine.config
    novel = bundled_text("northangerabbey")
    tokens = engine.prompting.count_tokens(novel)
    kept = config.final_cache_len
    print(f"model {engine.model_name}; HOMER keeps {kept} tokens (max_chunk_len {config.max_chunk_len})")
    print(f"document: the whole of Northanger Abbey, {tokens:,} tokens ({tokens / config.final_cache_len:.0f}x)\n")
    right = total = 0

    print("== LangChain: prompt | ChatHomer.with_structured_output(Schema) ==\n")
    # document= names the novel, so the whole text is what is compressed wherever it stands in the
    # prompt (without it, the prompt's first and last paragraphs would be taken for instructions)
    chat = ChatHomer(engine=engine, document=novel, max_tokens=args.max_new_tokens, mode=args.mode)
    for schema, task in (
        (Heroine, "Who is the heroine, where does her family live, and what is her father's profession?"),
        (Family, "Name the heroine's father and say how many children her parents have."),
        (Friends, "Who becomes the heroine's closest friend in Bath, and who is that friend's brother?"),
    ):
        chain = PROMPT | chat.with_structured_output(schema, include_raw=True)
        started = time.perf_counter()
        out = chain.invoke({"novel": novel, "task": task})
        seconds = time.perf_counter() - started
        source = out["raw"].response_metadata["homer"]["cache_source"]
        right += show(f"{schema.__name__}: {task}", out["parsed"], seconds, source)
        total += len(CHECKS[schema])

    print("== LlamaIndex: HomerQueryEngine(output_cls=Suitor), same engine ==\n")
    query_engine = HomerQueryEngine(
        [Document(text=novel, doc_id="northangerabbey")],
        llm=HomerLLM(engine=engine, max_tokens=args.max_new_tokens, mode=args.mode),
        output_cls=Suitor,
    )
    task = "Who is the man the heroine comes to love, what is his sister's name, and what is his father's house?"
    started = time.perf_counter()
    response = query_engine.query(task)
    seconds = time.perf_counter() - started
    source = response.source_nodes[0].metadata["homer"]["cache_source"]
    right += show(f"Suitor: {task}", response.response, seconds, source)
    total += len(CHECKS[Suitor])

    stats = engine.document_cache.stats()
    print(f"fields right: {right} of {total} (every record validated against its schema)")
    print(f"compressions: {stats.computations} for 4 schemas (memory hits: {stats.hits_memory})")


if __name__ == "__main__":
    cookbook_main(run, OUTPUT, __doc__, max_new_tokens=96, options=(), model="smollm2-135m-instruct", mode="shared")
