.PHONY: setup demo test lint bench

setup:
	bash scripts/setup.sh

demo: setup
	.venv/bin/homer-qa ask homer_integrations/data/prideprejudice.txt --demo --max-chars 60000 --max-new-tokens 64

test: setup
	.venv/bin/python -m pytest -q

lint:
	.venv/bin/ruff check .
