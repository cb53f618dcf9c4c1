"""Which setting reads the passkey back at 32k in query_aware mode (the key survives, the answer does not)."""
import json, os, sys, time
sys.path.insert(0, "benchmarks")
import torch
from passkey_lib import engine_for, make_sample, run_sample
from homer_integrations.models import load_model

dtype = getattr(torch, os.environ.get("DTYPE", "float32"))
model, tok = load_model("qwen2.5-coder-0.5b-instruct", dtype=dtype, device="cuda")
VARIANTS = {
    "default": {},
    "replay_flat": {"replay": "flat"},
    "paper_answer": {"reask_question": False},
    "cache_4096": {"final_cache_len": 4096},
    "mcl_2048": {"max_chunk_len": 2048},
    "warmup_16": {"warmup_layers": 16},
    "warmup_8": {"warmup_layers": 8},
}
n, tokens = 6, int(os.environ.get("TOKENS", "32000"))
samples = [make_sample(tok, tokens, (i + 0.5) / n, seed=int(os.environ.get("SEED", "1000")) + i) for i in range(n)]
out = open(os.path.join(os.environ.get("OUT", "."), f"readloss_{tokens}_{os.environ.get('SEED', '1000')}.jsonl"), "w")
for name, over in [(k, v) for k, v in VARIANTS.items() if k in os.environ.get("ONLY", k)]:
    engine = engine_for(model, tok, "qwen2.5-coder-0.5b-instruct", "query_aware", None, **over)
    t = time.perf_counter(); right = []
    for s in samples:
        row = run_sample(engine, "query_aware", s, diagnostics=name == "default")
        row |= {"variant": name, "dtype": str(dtype)}
        out.write(json.dumps(row) + "\n"); out.flush()
        right.append("1" if row["correct"] else "0")
    print(name, "".join(right), f"{time.perf_counter() - t:.0f}s", flush=True)
