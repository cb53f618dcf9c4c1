"""The RULER harness's sample generation, split, scoring and prompt, on the real generators and tokenizer."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("long_context_eval")
pytest.importorskip("wonderwords")

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
import ruler
import ruler_tasks


@pytest.fixture(scope="module")
def tokenizer_path(smol_parts) -> str:
    """The converted SmolLM2 directory (the generators' ``hf`` tokenizer helper loads it by path)."""
    from homer_integrations.engine.loading import SMOLLM2, converted_dir

    return str(converted_dir(SMOLLM2))


@pytest.fixture(scope="module")
def two_niah(tokenizer_path: str) -> list[ruler_tasks.RulerSample]:
    """Two niah_single_2 samples of 1024 tokens (generation takes seconds: made once)."""
    return ruler_tasks.make_samples("niah_single_2", 1024, 2, tokenizer_path)


def test_regex_sentences_split_at_sentence_ends() -> None:
    text = "It rains. Does it? Yes! e.g.no split here.  Last one"
    assert ruler_tasks.regex_sentences(text) == ["It rains.", "Does it?", "Yes!", "e.g.no split here.", "Last one"]


def test_niah_samples_split_into_head_document_question_answer_prefix(two_niah: list) -> None:
    samples = two_niah
    assert [s.index for s in samples] == [0, 1]
    for s in samples:
        whole = s.head + s.document + s.question + s.answer_prefix
        assert not any(m in whole for m in (ruler_tasks.OPEN, ruler_tasks.CLOSE, ruler_tasks.ANSWER))
        assert s.head.startswith("A special magic number is hidden")
        (value,) = s.outputs
        assert f"is: {value}." in s.document  # the needle is in the document, not in the question
        assert value not in s.question + s.answer_prefix
        assert s.question.lstrip().startswith("What is the special magic number for ")
        assert s.answer_prefix.endswith("mentioned in the provided text is")
        assert s.metric == "string_match_all" and s.max_new_tokens == 128


def test_vt_keeps_its_in_context_example_in_the_head(tokenizer_path: str) -> None:
    (s,) = ruler_tasks.make_samples("vt", 1024, 1, tokenizer_path)
    assert s.head.count("Memorize and track the chain(s)") == 2  # the example's instruction and the sample's
    assert s.head.rstrip().endswith("hidden in the following text.")
    assert all(f"VAR {v} = " in s.document for v in s.outputs)
    assert s.question.lstrip().startswith("Question: Find all variables that are assigned the value")


def test_score_is_rulers_metric() -> None:
    sample = ruler_tasks.RulerSample("vt", 4096, 0, "", "", "", "", ["AAAAA", "BBBBB"], "string_match_all", 30)
    assert ruler_tasks.score(sample, " aaaaa, BBBBB\n") == 1.0
    assert ruler_tasks.score(sample, " AAAAA only") == 0.5
    part = ruler_tasks.RulerSample("qa_1", 4096, 0, "", "", "", "", ["Paris", "paris city"], "string_match_part", 32)
    assert ruler_tasks.score(part, "It is Paris.") == 1.0
    assert ruler_tasks.score(part, "London") == 0.0


def test_sample_store_saves_once_and_refuses_drift(
    tmp_path: Path, tokenizer_path: str, two_niah: list, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = ruler_tasks.SampleStore(tmp_path)
    first = store.ensure("niah_single_2", 1024, 1, tokenizer_path)
    assert first == two_niah[:1], "the first sample does not depend on how many are generated"
    assert store.load("niah_single_2", 1024) == first
    # Later generations are the fixture's (the same generator's output): each run of RULER's niah.py
    # spends ~15 s sorting its 9M word pairs, whatever the sample count.
    monkeypatch.setattr(ruler_tasks, "make_samples", lambda task, length, n, path: two_niah[:n])
    assert store.ensure("niah_single_2", 1024, 1, "/no/tokenizer") == first, "a stored sample is not regenerated"
    tampered = store.path("niah_single_2", 1024)
    tampered.write_text(tampered.read_text().replace(first[0].outputs[0], "0000000"))
    with pytest.raises(RuntimeError, match="differs from a fresh generation"):
        store.ensure("niah_single_2", 1024, 2, tokenizer_path)


def test_every_method_sees_the_same_prompt(smol_engine) -> None:
    """HOMER's shared/full layout and kvpress's pipeline text are one chat prompt, split differently."""
    sample = ruler_tasks.RulerSample(
        "niah_single_2", 4096, 0, "Head text.\n", "The document body.", "\nWhat is it?", " It is", ["x"], "m", 8
    )
    suffix = smol_engine.config.document_suffix
    job = ruler.kvpress_job(sample, suffix)
    chat = smol_engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": job["context"] + job["question"]}], add_generation_prompt=True, tokenize=False
    )
    for mode in ("shared", "full"):
        p = ruler.homer_prompt(smol_engine, sample, mode)
        assert p.prefix + p.document + p.suffix + p.continuation == chat + job["answer_prefix"]
        assert (p.prefix + p.document + p.suffix) == chat.partition("What is it?")[0]


def test_paired_compares_only_the_samples_both_answered() -> None:
    def row(method: str, task: str, index: int, score: float) -> dict:
        return {"method": method, "task": task, "index": index, "length": 8192, "score": score,
                "ratio": 1.0 if method == "plain" else 4.0}  # fmt: skip

    rows = [
        row("plain", "vt", 0, 1.0),
        row("plain", "vt", 1, 0.0),
        row("homer_query_aware", "vt", 0, 1.0),
        row("homer_query_aware", "vt", 1, 1.0),
        row("homer_query_aware", "vt", 2, 0.0),  # plain has no sample 2: not compared
        row("plain", "qa_1", 0, 1.0),
        row("homer_query_aware", "qa_1", 0, 0.0),
    ]
    (c,) = ruler.paired(rows, "homer_query_aware", draws=200)
    assert c["pairs"] == {"qa_1": 1, "vt": 2}
    assert c["accuracy"] == pytest.approx((0.0 + 1.0) / 2)
    assert c["reference_accuracy"] == pytest.approx((1.0 + 0.5) / 2)
    assert c["difference"] == pytest.approx(((0 - 1) + (1.0 - 0.5)) / 2)
    low, high = c["interval_90"]
    assert low <= c["difference"] <= high
    assert "-0.250" in ruler.paired_markdown([c])
    assert "| method | homer_shared | difference |" in ruler.paired_markdown([{**c, "reference": "homer_shared"}])


def test_dtype_pairs_compare_each_method_with_its_float32_rows_only() -> None:
    def row(method: str, dtype: str, index: int, score: float, length: int = 8192) -> dict:
        return {"method": method, "task": "vt", "index": index, "length": length, "score": score, "dtype": dtype,
                "ratio": 1.0 if method == "plain" else 4.0}  # fmt: skip

    ours = [
        row("plain", "bfloat16", 0, 1.0),
        row("plain", "bfloat16", 1, 0.0),
        row("homer_query_aware", "bfloat16", 0, 1.0),
    ]
    reference = [
        row("plain", "float32", 0, 1.0),
        row("plain", "float32", 1, 1.0),
        row("plain", "float32", 2, 0.0),  # bfloat16 has no sample 2
        row("plain", "float32", 1, 0.0, length=4096),  # another length
        row("homer_query_aware", "float32", 0, 0.0),
        row("snapkv", "float32", 0, 1.0),  # no bfloat16 rows: not compared
    ]
    by_method = {c["method"]: c for c in ruler.dtype_pairs(ours, reference, "bfloat16", [8192], draws=50)}
    assert set(by_method) == {"plain bfloat16", "homer_query_aware bfloat16"}
    plain = by_method["plain bfloat16"]
    assert plain["reference"] == "plain float32" and plain["pairs"] == {"vt": 2}
    assert plain["difference"] == pytest.approx(-0.5)
    assert by_method["homer_query_aware bfloat16"]["difference"] == pytest.approx(1.0)


def test_a_press_is_compared_at_the_same_ratio() -> None:
    def row(method: str, ratio: float, index: int, score: float) -> dict:
        return {"method": method, "task": "vt", "index": index, "length": 4096, "score": score, "ratio": ratio}

    rows = [
        row("homer_shared", 4.0, 0, 1.0),
        row("homer_shared", 8.0, 0, 0.0),
        row("knorm", 4.0, 0, 0.0),
        row("knorm", 8.0, 0, 1.0),
        row("knorm", 8.0, 1, 1.0),  # the root has no sample 1: not compared
    ]
    by_ratio = {c["ratio"]: c for c in ruler.paired(rows, "homer_shared", "knorm", draws=50)}
    assert by_ratio[4.0]["difference"] == pytest.approx(1.0)
    assert by_ratio[8.0]["difference"] == pytest.approx(-1.0)
    assert by_ratio[8.0]["pairs"] == {"vt": 1}
    table = ruler.paired_markdown([by_ratio[4.0], {**by_ratio[8.0], "reference": "snapkv"}])
    assert "| versus |" in table and "| 4096 | homer_shared | 8x | snapkv | 1 (1) | 0.00 | 1.00 | -1.000 |" in table


def test_pooled_pairs_every_budget_both_ran_within_its_own_ratio() -> None:
    def row(method: str, length: int, ratio: float, task: str, score: float) -> dict:
        return {"method": method, "task": task, "index": 0, "length": length, "score": score, "ratio": ratio}

    rows = [
        row("homer_shared", 4096, 4.0, "vt", 1.0),
        row("kvzip", 4096, 4.0, "vt", 0.0),
        row("homer_shared", 8192, 8.0, "vt", 0.0),
        row("kvzip", 8192, 8.0, "vt", 0.0),
        row("kvzip", 8192, 4.0, "vt", 1.0),  # the root has no 8k, 4x row: not paired with its 8x one
        row("homer_shared", 8192, 8.0, "qa_1", 0.0),
        row("kvzip", 8192, 8.0, "qa_1", 1.0),
    ]
    (c,) = ruler.paired(rows, "homer_shared", "kvzip", draws=50, pooled=True)
    assert (c["length"], c["ratio"], c["pairs"]) == ("all", "all", {"qa_1": 1, "vt": 2})
    assert c["difference"] == pytest.approx(((0.0 - 1.0) + (1.0 - 0.0) / 2) / 2)
    assert "| all | homer_shared | all | 2 (3) |" in ruler.paired_markdown([c])


def test_summary_times_each_point_on_one_device() -> None:
    def row(task: str, index: int, device: str, seconds: float, score: float) -> dict:
        return {"method": "plain", "task": task, "index": index, "length": 16384, "ratio": 1.0, "score": score,
                "budget": 16000, "compress_seconds": seconds, "ttft": seconds / 10, "question_seconds": seconds,
                "peak_rss_mb": 3000.0, "device": device}  # fmt: skip

    rows = [row("vt", 0, "cpu", 400.0, 1.0), row("vt", 1, "cuda", 3.0, 0.0), row("qa_1", 0, "cuda", 5.0, 1.0)]
    (point,) = ruler.summarize(rows)["overall"]
    assert point["seconds_device"] == "cpu"
    assert point["compress_seconds"] == pytest.approx(400.0)  # qa_1 ran on the GPU only: no CPU seconds
    assert point["accuracy"] == pytest.approx((0.5 + 1.0) / 2)  # accuracy counts both devices
    assert point["tasks"]["vt"]["samples"] == 2
    (gpu,) = ruler.summarize(rows[1:])["overall"]
    assert gpu["seconds_device"] == "cuda" and gpu["compress_seconds"] == pytest.approx(4.0)
    table = ruler.markdown(ruler.summarize(rows))
    assert "| cpu |" in table and "| 0.75 (2) |" in table  # the average says over how many tasks
    assert "| 16384 | plain |" not in ruler.markdown(ruler.summarize(rows), lambda m: m != "plain")


def test_a_run_leaves_another_live_runs_job_list(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ruler, "WORK", tmp_path)
    mine = tmp_path / f"jobs-{os.getpid()}-1.jsonl"
    other = tmp_path / f"jobs-{os.getppid()}-2.jsonl"  # the parent is alive: another run's worker list
    ended = tmp_path / "jobs-999999999-3.jsonl"  # no such process: a run that ended
    for path in (mine, other, ended):
        path.write_text('["vt", 4096, 0]\n')
    ruler.drop_jobs()
    assert other.exists() and not mine.exists() and not ended.exists()


def test_reported_indices_skip_the_tuning_split() -> None:
    assert ruler_tasks.reported(range(8, 23)) == [8, 9, 20, 21, 22]
    assert ruler_tasks.reported(range(0, 10)) == list(range(10))
    assert ruler_tasks.reported(range(12, 18)) == []


def test_glance_pairs_each_tier_with_plain_over_every_glance_task() -> None:
    def row(method: str, task: str, score: float, ratio: float = 4.0) -> dict:
        return {"method": method, "task": task, "index": 0, "length": 8192, "score": score,
                "ratio": 1.0 if method == "plain" else ratio}  # fmt: skip

    rows = [row("plain", t, 1.0) for t in ruler.GLANCE_TASKS]
    rows += [row("homer_shared_headwise", t, 1.0 if t == "vt" else 0.5) for t in ruler.GLANCE_TASKS]
    rows += [row("knorm", t, 0.0) for t in ruler.GLANCE_TASKS] + [row("snapkv", t, 0.5) for t in ruler.GLANCE_TASKS]
    rows += [row("kvzip", "vt", 1.0)]  # one task only: no cell
    rows += [row("plain", "cwe", 0.0), row("homer_shared_headwise", "cwe", 0.0)]  # cwe is left out
    (point,) = ruler.glance(rows, draws=20)
    assert (point["length"], point["ratio"], point["plain"]["accuracy"]) == (8192, 4.0, 1.0)
    root = point["columns"]["shared root"]
    assert root["accuracy"] == pytest.approx((1.0 + 0.5 * 5) / 6)
    assert root["of_plain"] == pytest.approx(root["accuracy"])
    assert root["pairs"] == len(ruler.GLANCE_TASKS)
    assert "KVzip" not in point["columns"]
    assert point["columns"]["best other question-agnostic press"]["method"] == "snapkv"
    table = ruler.glance_markdown([point])
    assert "| 8192 | 4x | 1.00 (6) | - | 0.58 (0.58 of plain, 6) | - | 0.50 snapkv (0.50 of plain, 6) | - |" in table
