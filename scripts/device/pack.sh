#!/bin/bash
# Prepare what a lent GPU machine needs, here, before its lease starts (it reaches no registry and a
# call carries at most 64 MiB): wheels it lacks in .whl/, random-weight config dirs and the SmolLM2
# tokenizer in .gpu/, and an embedded model's GGUF cut into pieces in .xfer/ (one piece per call).
#
#   bash scripts/device/pack.sh [MODEL]      # MODEL: qwen2.5-coder-0.5b-instruct (default) or -1.5b-
#
# Then, with the device tool (each line one call, back to back: the machine stays warm 30 s):
#   carry [".whl", ".xfer/model"]  bash scripts/device/setup.sh   # first call: installs the wheels
#   carry [".gpu"]                 bash scripts/device/setup.sh   # only for checks.sh (random weights)
#   carry [".xfer/pNN"]            bash scripts/device/setup.sh   # one call per piece but the last
#   carry []                     bash scripts/device/checks.sh    # suite's CUDA tests + memory_speed
#   passkey:  source scripts/device/setup.sh && python3 benchmarks/passkey.py run --device cuda ...
#   RULER:    carry [".xfer/pLAST"]  bash scripts/device/ruler.sh   (issue #11's points; its header)
# A call carries at most 64 MiB with the tracked tree (21 MB now): .whl and .gpu do not fit one call
# together, and pieces are 45 MB (PIECE_BYTES), 11 of them, each call ~18 s of device time with the
# turnaround (H100, 2026-11-26; setup and pieces took ~4.5 of the 15 minutes). The machine goes back
# after 30 s idle: make the calls back to back. Keep every wheel: the package imports llguidance.
set -euo pipefail
cd "$(dirname "$0")/../.."
model=${1:-qwen2.5-coder-0.5b-instruct}
py=.venv/bin/python
exclude=$(git rev-parse --git-dir)/info/exclude
mkdir -p "$(dirname "$exclude")"
for d in /.whl/ /.gpu/ /.xfer/; do grep -qx "$d" "$exclude" 2>/dev/null || echo "$d" >>"$exclude"; done
# The device's image has torch and most of our needs; these it lacks or holds in an older version.
pins=$($py -m pip list 2>/dev/null | awk 'tolower($1) ~ /^(transformers|pydantic|pydantic_core|annotated-types|typing-inspection|platformdirs|gguf|llguidance|nvidia[-_]long[-_]context[-_]eval)$/ {print $1"=="$2}')
plat=""
for n in 17 24 27 28 31 34; do plat+=" --platform manylinux_2_${n}_x86_64"; done
$py -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux2014_x86_64 $plat -d .whl $pins
# Random-weight models of the real shapes (memory_speed.py --random-weights) and the test tokenizer.
models=$($py -c "from homer_integrations.paths import cache_root; print(cache_root() / 'models')")
for dir in "$models"/*/; do
  name=$(basename "$dir"); [ -f "$dir/config.json" ] || continue
  mkdir -p ".gpu/${name%-*}"
  cp "$dir"/{config.json,tokenizer.json,tokenizer_config.json} ".gpu/${name%-*}/"
  cp "$dir"/chat_template.jinja ".gpu/${name%-*}/" 2>/dev/null || true
done
# The model's GGUF, joined and hash-checked by the package, cut into pieces that fit one call.
rm -rf .xfer && mkdir -p .xfer
gguf=$($py - "$model" <<'PY'
import sys, tempfile
from pathlib import Path
from homer_integrations.engine.loading import EMBEDDED_MODELS, gguf_file
spec = EMBEDDED_MODELS[sys.argv[1]]
print(gguf_file(spec, Path(tempfile.mkdtemp(prefix="homer-pack-"))))
PY
)
split -b "${PIECE_BYTES:-40000000}" -d -a 2 "$gguf" .xfer/p
case "$gguf" in /tmp/homer-pack-*) rm -rf "$(dirname "$gguf")" ;; esac
echo "$model $(ls .xfer/p?? | wc -l)" >.xfer/model
du -sh .whl .gpu .xfer
