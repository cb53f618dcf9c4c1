"""What LangChain adds: five questions through an unchanged LCEL QA chain vs the same work on ``HomerModel``.

Both sides use the same loaded model, each with a fresh document cache, the same excerpt of the
bundled Pride and Prejudice, greedy decoding and the same questions:

- direct: one ``HomerModel.compress`` then five ``HomerModel.run`` on the compressed document;
- langchain: ``ChatPromptTemplate | ChatHomer`` invoked five times with the whole excerpt in
  ``{context}`` (the first call finds the document in the prompt and compresses it, the others
  find it again and read the cache).

Target (issue 4): langchain total <= 1.5 x direct total. The sides run ``--rounds`` times,
alternating; the ratio uses each side's fastest round (the machine is shared and noisy). The
chain's prompt adds its instructions after the cache (about 20 tokens per question), and
answers may differ in length, so output tokens are recorded for both sides.

    .venv/bin/python benchmarks/langchain_overhead.py                 # 16k-token document
    .venv/bin/python benchmarks/langchain_overhead.py --tokens 2000   # quick check

Writes benchmarks/results/langchain_overhead.json.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads: idle threads yield the CPU

sys.path.insert(0, str(Path(__file__).parent))
from homer_baseline import QUESTIONS, ask_each, compare_with_direct, fresh_engine, overhead_options
from langchain_core.prompts import ChatPromptTemplate

from homer_integrations import HomerModel
from homer_integrations.langchain import ChatHomer

RESULTS = Path(__file__).parent / "results" / "langchain_overhead.json"
PROMPT = ChatPromptTemplate.from_messages(
    [("human", "Answer the question using the text below.\n\n{context}\n\nQuestion: {question}\nAnswer briefly.")]
)
TARGET_RATIO = 1.5


def run_chain(base: HomerModel, text: str, max_new_tokens: int) -> dict[str, Any]:
    engine = fresh_engine(base)
    chain = PROMPT | ChatHomer(engine=engine, max_tokens=max_new_tokens)

    def ask(question: str) -> tuple[str, dict[str, Any]]:
        message = chain.invoke({"context": text, "question": question})
        homer = message.response_metadata["homer"]
        return message.text, {
            "output_tokens": message.usage_metadata["output_tokens"],
            "document_found_by/cache_source": f"{homer['document_found_by']}/{homer['cache_source']}",
        }

    return ask_each(engine, QUESTIONS, ask, "question_seconds")


if __name__ == "__main__":
    options = overhead_options(__doc__.splitlines()[0], RESULTS)
    compare_with_direct("langchain", run_chain, QUESTIONS, options, TARGET_RATIO)
