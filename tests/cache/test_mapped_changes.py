"""A memory-mapped leaf tier whose file is changed underneath a live process (issue 82, item 3).

A leaf tier (and each leaf of a content-split tier) is read memory-mapped and kept in memory across
questions. Truncating its file in place then killed the process with SIGBUS at the next question, and
overwriting it in place served the damaged K/V. The cache never does either itself (writes rename a
new file over the name, removals unlink), so these tests do what another program could: truncate or
overwrite the file in place, through real files and a real engine (a tiny random-weight model).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from homer_integrations.cache import DocumentCache
from homer_integrations.cache.stored import DocumentCacheWarning
from tests.conftest import REPO, mode_engine
from tests.homer.leaves.test_leaf_reuse import tier_of
from tests.homer.leaves.tier_helpers import assert_same_tier

QUESTION = "Who is Mr. Bingley?"


def stored_engine(tokenizer, calibration, directory: Path, split: str):
    """A tiny engine whose document cache is ``directory`` (``split``: how its leaf tiers are cut)."""
    from homer_integrations import HomerConfig, HomerModel
    from homer_integrations.homer.reading.strategies import Recipe
    from tests.conftest import tiny_model

    config = HomerConfig(max_chunk_len=128, warmup_layers=3, split=split, mode="query_aware")
    return HomerModel(
        tiny_model(), tokenizer, config, calibration_dir=calibration, progress=False, store=directory,
        recipe=Recipe(calibration_segments=2),
    )  # fmt: skip


def mapped_file(engine, document: str, split: str) -> tuple[str, Path]:
    """(the tier's key, the file one of its mapped leaves lives in): the tier's own file with even splits,
    its fourth leaf's with the content split."""
    tier, _ = engine.tiers.leaf_tier(engine.prompting.layout("", "query_aware").prefix, document)
    assert tier.mapped, "a tier in a local cache directory is memory-mapped"
    store = engine.document_cache.store
    key = engine.entry_key(document)
    return key, store.tensors_file(tier.leaf_keys[3] if split == "content" else key)


def overwrite_in_place(path: Path) -> None:
    """Damage the tensors in ``path`` without changing its name, inode or size (as ``dd conv=notrunc`` would)."""
    size = path.stat().st_size
    with path.open("r+b") as f:
        f.seek(size // 2)
        f.write(b"\x7f" * 256)  # NaN in float32 and bfloat16


@pytest.mark.parametrize("split", ["even", "content"])
def test_a_mapped_tier_overwritten_in_place_is_read_again_not_served(tokenizer, calibration, text, tmp_path, split):
    """Overwritten in place, a held mapping reads the new bytes: the tier in memory was served damaged."""
    engine = stored_engine(tokenizer, calibration, tmp_path, split)
    engine.cache_document(text)
    _, path = mapped_file(engine, text, split)
    overwrite_in_place(path)
    with pytest.warns(DocumentCacheWarning, match="discarding unusable document cache entry"):
        again = tier_of(engine, text)
    fresh = mode_engine(tokenizer, calibration, split=split, mode="query_aware")  # in memory only
    assert_same_tier(again, tier_of(fresh, text))
    assert engine.answer(text, QUESTION, max_new_tokens=3) == fresh.answer(text, QUESTION, max_new_tokens=3)


def test_a_mapped_tier_whose_file_was_replaced_is_read_again(tokenizer, calibration, text, tmp_path) -> None:
    """Another process removed the entry and wrote it anew (a new file renamed in): the held mapping of the old
    file stays valid, and the next question reads the new file rather than keep the old one alive."""
    engine = stored_engine(tokenizer, calibration, tmp_path, "even")
    engine.cache_document(text)
    key, path = mapped_file(engine, text, "even")
    other = stored_engine(tokenizer, calibration, tmp_path, "even")  # a second handle on the same directory
    assert other.document_cache.discard(key) and other.cache_document(text)[1] == "computed"
    again, source = engine.tiers.leaf_tier(engine.prompting.layout("", "query_aware").prefix, text)
    assert source == "disk", "read from the new file, verified, not served from the old mapping"
    assert again.mapped and path.exists()


CHILD = textwrap.dedent(
    """
    import os, sys
    from pathlib import Path
    from homer_integrations.cache import DocumentCache

    directory, key = Path(sys.argv[1]), sys.argv[2]
    cache = DocumentCache(directory)  # a long-running process: the tier stays mapped in its memory
    tier = cache.get(key)
    assert tier is not None and tier.mapped
    touched = lambda t: sum(float(x.float().sum()) for p in t.pieces for x in (*p.keys, *p.values, p.hidden))
    touched(tier)
    del tier
    print("mapped", flush=True)
    sys.stdin.readline()  # the parent truncates the file in place meanwhile
    again = cache.get(key)
    if again is not None:
        touched(again)
    print("served" if again is not None else "refused", flush=True)
    """
)


@pytest.mark.parametrize("split", ["even", "content"])
def test_a_mapped_tier_truncated_in_place_never_kills_the_process(tokenizer, calibration, text, tmp_path, split):
    """Truncated in place under a process that holds it mapped, the next read of the tier killed that process
    with SIGBUS; now it finds the file changed, reads it again, finds it unusable and refuses it."""
    engine = stored_engine(tokenizer, calibration, tmp_path, split)
    engine.cache_document(text)
    key, path = mapped_file(engine, text, split)
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(tmp_path), key],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert child.stdout.readline().strip() == "mapped", child.stderr.read()
        os.truncate(path, path.stat().st_size // 3)
        out, err = child.communicate("go\n", timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode != -signal.SIGBUS, "killed by SIGBUS reading the truncated mapping"
    assert child.returncode == 0 and out.strip() == "refused", (child.returncode, out, err)
    fresh = DocumentCache(tmp_path)
    assert fresh.get(key) is None, "the truncated file is unusable"
