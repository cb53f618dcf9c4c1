"""What LlamaIndex adds: five queries through ``HomerQueryEngine`` vs the same work on ``HomerModel``.

Both sides use the same loaded model, each with its own fresh document cache, on the same
excerpt of the bundled Pride and Prejudice, greedy decoding and the same questions:

- direct: one ``HomerModel.compress`` then five ``HomerModel.run`` on the compressed document;
- llama_index: five ``HomerQueryEngine.query`` (the first compresses, the rest reuse the cache).

Target (issue 5): llama_index total <= 1.5 x direct total. The sides run ``--rounds`` times,
alternating, and the ratio uses each side's fastest round (the machine is shared and noisy).

    .venv/bin/python benchmarks/llama_index_overhead.py            # 16k-token document
    .venv/bin/python benchmarks/llama_index_overhead.py --tokens 2000   # quick

Writes benchmarks/results/llama_index_overhead.json.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads: idle threads yield the CPU

sys.path.insert(0, str(Path(__file__).parent))
from homer_baseline import QUESTIONS, ask_each, compare_with_direct, fresh_engine, overhead_options
from llama_index.core.schema import Document

from homer_integrations import HomerModel
from homer_integrations.llama_index import HomerLLM, HomerQueryEngine

RESULTS = Path(__file__).parent / "results" / "llama_index_overhead.json"
TARGET_RATIO = 1.5


def run_llama_index(base: HomerModel, text: str, max_new_tokens: int) -> dict[str, Any]:
    engine = fresh_engine(base)
    query_engine = HomerQueryEngine(
        [Document(text=text, id_="doc")], HomerLLM(engine=engine, num_output=max_new_tokens)
    )

    def ask(question: str) -> tuple[str, dict[str, Any]]:
        response = query_engine.query(question)
        return str(response), {"cache_sources": response.source_nodes[0].node.metadata["homer"]["cache_source"]}

    return ask_each(engine, QUESTIONS, ask, "query_seconds")


def same_answers(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    return {"same_answers": all(r["direct"]["answers"] == r["llama_index"]["answers"] for r in rounds)}


if __name__ == "__main__":
    options = overhead_options(__doc__.splitlines()[0], RESULTS)
    compare_with_direct("llama_index", run_llama_index, QUESTIONS, options, TARGET_RATIO, extra=same_answers)
