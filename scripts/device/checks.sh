#!/bin/bash
# Device side: the suite's CUDA checks, then memory_speed on the shipped Qwen shapes (random weights),
# results under $OUT. Run after scripts/device/setup.sh has installed the wheels.
source "$(dirname "$0")/setup.sh" >/dev/null
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" | tee -a "$OUT/gpu.txt"
timeout 180 python3 -m pytest -q -p no:cacheprovider -rs tests/homer/test_devices.py 2>&1 | tee "$OUT/devices.log" | tail -5
for m in 0.5b 1.5b; do
  timeout 170 python3 benchmarks/memory_speed.py --device cuda --dtype bfloat16 --model qwen2.5-coder-$m-instruct \
    --random-weights /tmp/gpu/qwen2.5-coder-$m-instruct --tokens ${TOKENS:-8000 32000 64000} \
    --methods plain homer tier question 2>&1 | grep -v Warning | tee "$OUT/memory_$m.log" | tail -12
done
cp benchmarks/results/memory_speed_cuda.json benchmarks/results/memory_speed_cuda.md "$OUT/" 2>/dev/null
