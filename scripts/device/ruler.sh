#!/bin/bash
# Device side: RULER rows for issue #11's points (plain prefill, the per-question path and the shared
# root at 2048 kept tokens: 32k 16x, 16k 8x, 8k 4x). PLAN lists length:samples steps; each step is one
# `ruler.py run` (one fresh worker per method, so few steps: a worker's start costs ~10 s), and rows
# already in results/ruler.jsonl are skipped, so a step only adds samples and a second call resumes.
# Stops itself after $BUDGET seconds (default 480, under a call's 600 s limit), keeps what finished,
# and leaves ruler.jsonl and ruler.log in $OUT. First (OVERHEAD=0 skips it, ~1-2 min) the per-question
# path's launch-bound cost, batched against leaf by leaf (benchmarks/question_overhead.py --device cuda),
# and the shared root's build in row blocks of 1,024 against 8,192 (benchmarks/root_overhead.py); then
# (PROFILE=0 skips it) a profile of one 32k question on the real model (research/question_profile.py).
#
#   carry [".whl", ".xfer/model"]  bash scripts/device/setup.sh     # see pack.sh (the wheels include
#   carry [".xfer/pNN"] ...        bash scripts/device/setup.sh     #  the RULER package, for scoring)
#   carry [".xfer/pLAST"]  BUDGET=420 PLAN="32768:5 16384:10 32768:10" bash scripts/device/ruler.sh
#
# Measured on an H100 (2026-11-26, fp32): 32k, 5 samples of 6 tasks, plain + per-question + shared
# root took 376 s (plain 162 s, per-question 89 s, shared the rest, worker starts included); on a
# second lease (2026-11-27) samples 5-9 took the whole 450 s budget (the first worker converts the
# model's GGUF), leaving the shared root's last five qa_1 samples undone.
#
# The samples are the committed ones (benchmarks/results/ruler_samples/), so the device generates
# nothing. Back here: cp "$files_at/ruler.jsonl" benchmarks/results/ && .venv/bin/python
# benchmarks/ruler.py report
source "$(dirname "$0")/setup.sh" >/dev/null
cd "$(dirname "$0")/../.."
deadline=$((SECONDS + ${BUDGET:-480}))
tasks=${TASKS:-niah_single_2 niah_multikey_2 niah_multivalue niah_multiquery vt qa_1}
log=${OUT:-/tmp}/ruler.log
if [ "${OVERHEAD:-1}" = 1 ]; then  # batched vs leaf-by-leaf question scoring where launches set the pace
  timeout 150 python3 benchmarks/question_overhead.py --device cuda >>"$log" 2>&1 && tail -n 3 "$log"
  timeout 200 python3 benchmarks/root_overhead.py --device cuda >>"$log" 2>&1 && tail -n 4 "$log"
  cp benchmarks/results/question_overhead_cuda.* benchmarks/results/root_overhead_cuda.* "${OUT:-/tmp}/" 2>/dev/null
fi
if [ "${PROFILE:-1}" = 1 ]; then  # where one 32k question's time goes on the real model (~1 min)
  timeout 120 python3 research/question_profile.py --device cuda >>"$log" 2>&1 && grep -m1 "profiled" "$log"
  cp benchmarks/results/question_profile_cuda.txt "${OUT:-/tmp}/" 2>/dev/null
fi
for step in ${PLAN:-32768:5 16384:10 32768:10}; do
  length=${step%:*} samples=${step#*:}
  left=$((deadline - SECONDS))
  [ "$left" -gt 30 ] || break
  echo "== $length tokens, samples 0-$((samples - 1)), $left s left" | tee -a "$log"
  timeout -s INT "$left" python3 benchmarks/ruler.py run --device "${DEVICE:-cuda}" --dtype float32 \
    --lengths "$length" --ratios $((length / 2048)) --samples "$samples" --tasks $tasks \
    --methods ${METHODS:-plain homer_query_aware homer_shared} >>"$log" 2>&1
  grep -E "^(plain|homer)|Error|error:" "$log" | tail -n 6
done
python3 -c "import sys; sys.path.insert(0, 'benchmarks'); import ruler; ruler.merge_pending()"
cp benchmarks/results/ruler.jsonl "${OUT:-/tmp}/"
