"""RULER samples from NVIDIA's ``nvidia-long-context-eval`` generators, offline, split for compression.

The generators are the installed package's own scripts (``long_context_eval/data/synthetic/*.py``),
run in-process with the arguments RULER's ``prepare.py`` gives them (task settings from the
package's ``synthetic.yaml``, template and answer length from its ``constants.TASKS``, the ``base``
model template). Two hooks are replaced, nothing else:

- nltk's ``sent_tokenize`` (its data is a download) by a regex splitter at ``. ! ?`` + whitespace;
- the tokenizer is the package's own ``hf`` helper pointed at our converted Qwen directory.

To split every sample into instruction head / document / question / answer prefix, the template
handed to the generator carries three one-character markers (around ``{context}`` and before the
answer prefix); they are removed afterwards. Each marker costs about a token of the generator's
length budget. Scoring uses RULER's per-sample metrics (``string_match_all`` / ``string_match_part``)
from the package's eval module, after the same clean-up its ``evaluate.py`` applies to predictions.
"""

from __future__ import annotations

import json
import re
import runpy
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

TASKS = ("niah_single_2", "niah_multikey_2", "niah_multivalue", "niah_multiquery", "vt", "cwe", "qa_1")
"""The RULER tasks this harness runs (any key of the package's ``synthetic.yaml`` works)."""

TUNING = range(10, 20)
"""Sample indices the probes (``research/headwise_probe.py``, ``research/probe_depth.py``, ...) choose recipes on;
``ruler.py`` never reports them. Reported samples are 0-9 and, beyond ten a task, 20 on (the
generators are seeded, so an index is always the same sample)."""


def reported(indices: range) -> list[int]:
    """``indices`` without the tuning split."""
    return [i for i in indices if i not in TUNING]


OPEN, CLOSE, ANSWER = "\x1c", "\x1d", "\x1e"
"""Markers around the context and before the answer prefix (no generator edits control characters)."""

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


@dataclass(frozen=True)
class RulerSample:
    """One RULER input, split so that the document can be compressed without the question.

    ``head + document + question + answer_prefix`` is RULER's input text (model template ``base``).
    ``outputs`` are the reference strings; ``metric`` is ``string_match_all`` or ``string_match_part``.
    """

    task: str
    length: int
    index: int
    head: str
    document: str
    question: str
    answer_prefix: str
    outputs: list[str]
    metric: str
    max_new_tokens: int

    @property
    def key(self) -> tuple[str, int, int]:
        return (self.task, self.length, self.index)


def regex_sentences(text: str, language: str = "english") -> list[str]:
    """Stand-in for ``nltk.sent_tokenize``: split after ``.``, ``!`` or ``?`` followed by whitespace."""
    return [s for s in _SENTENCE_END.split(text) if s]


def _package_dir() -> Path:
    import long_context_eval

    return Path(long_context_eval.__file__).parent


def task_config(task: str) -> dict[str, Any]:
    """The package's settings for ``task``: its ``synthetic.yaml`` entry merged with ``constants.TASKS``."""
    import yaml
    from long_context_eval.data.synthetic.constants import TASKS as BASE

    tasks = yaml.safe_load((_package_dir() / "synthetic.yaml").read_text())
    if task not in tasks:
        raise ValueError(f"unknown RULER task {task!r}; known: {', '.join(tasks)}")
    config = dict(tasks[task])
    config.update(BASE[config["task"]])
    return config


def _patch_sentence_splitter() -> None:
    """Point ``nltk.tokenize.sent_tokenize`` at the regex splitter (a stub module when nltk is absent)."""
    try:
        import nltk.tokenize as tokenize
    except ImportError:
        import types

        nltk = types.ModuleType("nltk")
        tokenize = types.ModuleType("nltk.tokenize")
        nltk.tokenize = tokenize  # type: ignore[attr-defined]
        sys.modules.update({"nltk": nltk, "nltk.tokenize": tokenize})
    tokenize.sent_tokenize = regex_sentences  # type: ignore[assignment]


def _marked_template(config: dict[str, Any]) -> tuple[str, str]:
    """(template, answer prefix) with the markers in, as ``prepare.py`` assembles them for ``base``."""
    template = config["template"].replace("{context}", OPEN + "{context}" + CLOSE)
    return template, ANSWER + config.get("answer_prefix", "")


def run_generator(task: str, length: int, num_samples: int, tokenizer_path: str) -> list[dict[str, Any]]:
    """Raw generator rows ``{index, input, outputs, length}`` (markers still in) for ``task`` at ``length``."""
    config = task_config(task)
    if config["task"] == "qa" and length < 2048:
        # qa.py adds documents 10 at a time and retries forever when not even 10 fit
        raise ValueError(f"{task}: RULER's qa generator needs a length of at least 2048 tokens")
    synthetic = _package_dir() / "data" / "synthetic"
    # the scripts import their neighbours as top-level modules (``constants``, ``tokenizer``)
    for path in (str(synthetic), str(synthetic.parent)):
        if path not in sys.path:
            sys.path.insert(0, path)
    _patch_sentence_splitter()
    template, answer_prefix = _marked_template(config)
    # variable_tracking compares the template with ``constants.TASKS`` to decide how to format its
    # in-context example: give it the marked copy so it takes RULER's ordinary path
    import constants  # the generators' own module (``synthetic/constants.py``)

    constants.TASKS[config["task"]] = {**constants.TASKS[config["task"]], "answer_prefix": answer_prefix}
    constants.TASKS[config["task"]]["template"] = template
    with tempfile.TemporaryDirectory() as tmp:
        argv = [
            config["task"],
            "--save_dir", tmp,
            "--save_name", task,
            "--tokenizer_path", tokenizer_path,
            "--tokenizer_type", "hf",
            "--max_seq_length", str(length),
            "--tokens_to_generate", str(config["tokens_to_generate"]),
            "--num_samples", str(num_samples),
            "--random_seed", "42",
            "--template", template + answer_prefix,
        ]  # fmt: skip
        for name, value in config["args"].items():
            argv += [f"--{name}", str(value)]
        if config["task"] == "qa":
            argv += ["--pre_samples", "0"]
        saved_argv = sys.argv
        sys.argv = argv
        try:
            runpy.run_path(str(synthetic / f"{config['task']}.py"), run_name="__main__")
        finally:
            sys.argv = saved_argv
        out = Path(tmp) / task / "validation.jsonl"
        return [json.loads(line) for line in out.read_text().splitlines() if line.strip()]


def split_input(text: str) -> tuple[str, str, str, str]:
    """(head, document, question, answer prefix) of a marked generator input.

    The LAST marked context is the sample's: in-context examples (vt, cwe) come before it and
    belong to the head, with their markers dropped.
    """
    start = text.rindex(OPEN)
    end = text.index(CLOSE, start)
    tail = text[end + 1 :]
    question, _, answer_prefix = tail.partition(ANSWER)
    head = text[:start]
    for marker in (OPEN, CLOSE, ANSWER):
        head = head.replace(marker, "")
    return head, text[start + 1 : end], question, answer_prefix


def make_samples(task: str, length: int, num_samples: int, tokenizer_path: str) -> list[RulerSample]:
    """``num_samples`` split samples; the first k are the same for any ``num_samples`` >= k."""
    config = task_config(task)
    metric = _metric_name(config["task"])
    samples = []
    for row in run_generator(task, length, num_samples, tokenizer_path):
        head, document, question, answer_prefix = split_input(row["input"])
        outputs = row["outputs"] if isinstance(row["outputs"], list) else [row["outputs"]]
        samples.append(
            RulerSample(
                task=task,
                length=length,
                index=row["index"],
                head=head,
                document=document,
                question=question,
                answer_prefix=answer_prefix,
                outputs=[str(o) for o in outputs],
                metric=metric,
                max_new_tokens=config["tokens_to_generate"],
            )
        )
    return samples


def _metric_name(kind: str) -> str:
    from long_context_eval.eval.synthetic.constants import TASKS as METRICS

    return METRICS[kind]["metric_fn"].__name__


def clean_prediction(prediction: str) -> str:
    """RULER's ``postprocess_pred``: strip, control characters to newlines, strip again."""
    return re.sub(r"[\x00-\x1f]", "\n", prediction.strip()).strip()


def score(sample: RulerSample, prediction: str) -> float:
    """RULER's per-sample score in [0, 1] (its metric functions return percentages)."""
    from long_context_eval.eval.synthetic import constants

    per_sample = getattr(constants, f"{sample.metric}_per_sample")
    return per_sample([clean_prediction(prediction)], [sample.outputs])[0] / 100.0


class SampleStore:
    """Samples saved once as JSONL, one file per task and length, under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, task: str, length: int) -> Path:
        return self.root / f"{task}_{length}.jsonl"

    def load(self, task: str, length: int) -> list[RulerSample]:
        path = self.path(task, length)
        if not path.is_file():
            return []
        return [RulerSample(**json.loads(line)) for line in path.read_text().splitlines() if line.strip()]

    def ensure(self, task: str, length: int, num_samples: int, tokenizer_path: str) -> list[RulerSample]:
        """The first ``num_samples`` samples, generating (and saving) only when fewer are stored."""
        stored = self.load(task, length)
        if len(stored) < num_samples:
            fresh = make_samples(task, length, num_samples, tokenizer_path)
            for old, new in zip(stored, fresh, strict=False):
                if old != new:
                    raise RuntimeError(
                        f"{self.path(task, length)}: sample {old.index} differs from a fresh generation "
                        f"(generator or tokenizer changed); move the file away to start over"
                    )
            self.root.mkdir(parents=True, exist_ok=True)
            tmp = self.path(task, length).with_suffix(".partial")
            tmp.write_text("".join(json.dumps(asdict(s)) + "\n" for s in fresh))
            tmp.replace(self.path(task, length))
            stored = fresh
        return stored[:num_samples]
