#!/bin/bash
# Device side: RULER rows for issue #11's points (plain prefill, the per-question path and the shared
# root at 2048 kept tokens: 8k 4x, 16k 8x, 32k 16x), sample by sample so that every sample is answered
# by each method before the next one starts. Stops itself after $BUDGET seconds (default 480, under a
# call's 600 s limit), keeps what finished, and leaves results/ruler.jsonl in $OUT.
#
#   carry [".whl", ".gpu", ".xfer/model"]  bash scripts/device/setup.sh      # see pack.sh (the wheels
#   carry [".xfer/pNN"] ...                bash scripts/device/setup.sh      #  include the RULER package)
#   carry []   LENGTHS="32768 16384" SAMPLES=10 bash scripts/device/ruler.sh
#
# The samples are the committed ones (benchmarks/results/ruler_samples/), so the device generates
# nothing; rows already in results/ruler.jsonl are skipped, so a second call resumes. Back here:
# cp "$files_at/ruler.jsonl" benchmarks/results/ && .venv/bin/python benchmarks/ruler.py report
source "$(dirname "$0")/setup.sh" >/dev/null
cd "$(dirname "$0")/../.."
deadline=$((SECONDS + ${BUDGET:-480}))
tasks="niah_single_2 niah_multikey_2 niah_multivalue niah_multiquery vt qa_1"
for n in $(seq 1 "${SAMPLES:-10}"); do
  for length in ${LENGTHS:-32768 16384 8192}; do
    ratio=$((length / 2048))
    left=$((deadline - SECONDS))
    [ "$left" -gt 20 ] || break 2
    timeout -s INT "$left" python3 benchmarks/ruler.py run --device cuda --dtype float32 --lengths "$length" \
      --ratios "$ratio" --samples "$n" --tasks $tasks --methods plain homer_query_aware homer_shared 2>&1 |
      grep -E "^(plain|homer)" | tail -n 18
  done
done
python3 -c "import sys; sys.path.insert(0, 'benchmarks'); import ruler; ruler.merge_pending()"
cp benchmarks/results/ruler.jsonl "$OUT/"
