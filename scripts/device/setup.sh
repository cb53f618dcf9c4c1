#!/bin/bash
# Device side (source it or run it in every call): install the carried wheels once, keep the GGUF
# pieces carried so far, and once all are there put the joined file where the package looks for it.
# See scripts/device/pack.sh for the order of calls.
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export HOMER_INTEGRATIONS_CACHE=/tmp/hcache HOMER_TEST_TOKENIZER=/tmp/gpu/smollm2-135m-instruct
if [ -d .whl ] && [ ! -d /tmp/site/transformers ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
[ -d .gpu ] && mkdir -p /tmp/gpu && cp -r .gpu/. /tmp/gpu/
mkdir -p /tmp/xfer && cp .xfer/p?? .xfer/model /tmp/xfer/ 2>/dev/null
ls /tmp/xfer
[ -f /tmp/xfer/model ] || return 0 2>/dev/null || exit 0
python3 - <<'PY'
import hashlib, importlib.util, sys
from pathlib import Path
sys.path.insert(0, "/tmp/site")
from homer_integrations.engine.loading import EMBEDDED_MODELS, converted_dir
name, count = Path("/tmp/xfer/model").read_text().split()
spec = EMBEDDED_MODELS[name]
work = converted_dir(spec).with_name(converted_dir(spec).name + ".work")
target = work / spec.gguf_name
pieces = sorted(Path("/tmp/xfer").glob("p??"))
if target.is_file() or len(pieces) < int(count):
    print(f"{len(pieces)} of {count} pieces{', joined already' if target.is_file() else ''}")
    sys.exit(0)
digest = hashlib.sha256()
for p in pieces:
    digest.update(p.read_bytes())
if digest.hexdigest() != spec.sha256:
    sys.exit(f"the {count} pieces of {name} fail its sha256 check: carry them again")
work.mkdir(parents=True, exist_ok=True)
with target.open("wb") as out:
    for p in pieces:
        out.write(p.read_bytes())
# The parts' packages must import (the package finds the parts first), but the joined file, already
# in place and hash-checked, is what loads: each stub part names an empty file.
for module, _ in spec.parts:
    if importlib.util.find_spec(module) is None:
        stub = Path("/tmp/site") / module
        stub.mkdir(parents=True, exist_ok=True)
        (stub / "__init__.py").write_text('def get_part_path():\n    return "/dev/null"\n')
print(f"joined {target} ({target.stat().st_size} bytes, sha256 ok)")
PY
