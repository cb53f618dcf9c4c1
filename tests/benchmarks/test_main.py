"""``python -m benchmarks``: the suites it lists, the commands it runs, its errors (nothing is measured here)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from benchmarks import __main__ as cli
from benchmarks.suites import SUITES

ROOT = Path(__file__).resolve().parents[2]

# What the Makefile's `bench` target ran before it called `python -m benchmarks run quick`.
MAKE_BENCH_BEFORE = [
    "benchmarks/cache_latency.py --quick",
    "benchmarks/novel_qa.py run --models smollm2-135m-instruct --tokens 8000 --methods shared",
    "benchmarks/novel_qa.py report",
]


@pytest.fixture(autouse=True)
def no_benchmark_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """No test here runs a real benchmark: the runner's ``subprocess.run`` (only its own) fails the test."""

    def refuse(argv: list[str], **_: object) -> None:
        pytest.fail(f"a benchmark would have run: {argv}")

    monkeypatch.setattr(cli, "subprocess", SimpleNamespace(run=refuse))


def dry_run(capsys: pytest.CaptureFixture[str], suite: str, *argv: str) -> list[str]:
    """The commands ``run SUITE --dry-run ARGV`` prints, each without its interpreter."""
    assert cli.main(["run", suite, "--dry-run", *argv]) == 0
    return [line.split(" ", 1)[1] for line in capsys.readouterr().out.splitlines()]


def test_list_names_every_suite_once_a_line_through_the_real_entry_point() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks", "list"], cwd=ROOT, capture_output=True, text=True, check=True, timeout=30
    ).stdout
    lines = out.splitlines()
    assert [line.split()[0] for line in lines] == list(SUITES)
    assert set(SUITES) >= {"quick", "quality", "speed", "memory", "peers", "whole-book"}
    for line, suite in zip(lines, SUITES.values(), strict=True):
        assert suite.cpu_time in line
        assert all(step.script in line for step in suite.steps)


@pytest.mark.parametrize("name", ["nope", "Quick", "whole_book"])
def test_an_unknown_suite_exits_2_naming_the_known_ones(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["run", name]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and repr(name) in err
    assert all(known in err for known in SUITES)


def test_quick_is_what_make_bench_ran_and_make_bench_runs_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert dry_run(capsys, "quick") == MAKE_BENCH_BEFORE
    recipe = re.search(r"^bench:.*\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(), re.M)
    assert recipe is not None
    assert recipe.group(1).split() == ["$(BENCH_ENV)", ".venv/bin/python", "-m", "benchmarks", "run", "quick"]


def test_extra_arguments_skip_report_steps_and_only_keeps_a_script(capsys: pytest.CaptureFixture[str]) -> None:
    assert dry_run(capsys, "quick", "--", "--max-new-tokens", "8") == [
        MAKE_BENCH_BEFORE[0] + " --max-new-tokens 8",
        MAKE_BENCH_BEFORE[1] + " --max-new-tokens 8",
        MAKE_BENCH_BEFORE[2],
    ]
    assert dry_run(capsys, "speed", "--only", "decode_speed", "--", "--repeats", "1") == [
        "benchmarks/decode_speed.py --repeats 1"
    ]
    assert cli.main(["run", "speed", "--only", "novel_qa", "--dry-run"]) == 2


def test_every_script_a_suite_names_exists_and_knows_its_flags() -> None:
    for suite in SUITES.values():
        assert suite.steps, suite.name
        for step in suite.steps:
            path = ROOT / step.script
            assert path.is_file(), f"{suite.name}: {step.script} is missing"
            source = path.read_text(encoding="utf-8")
            for flag in (a for a in step.args if a.startswith("--")):
                assert f'"{flag}"' in source, f"{suite.name}: {step.script} has no option {flag}"


class Recorder:
    """Stands in for ``subprocess.run``: records each call, fails the ``fail_at``-th (1-based)."""

    def __init__(self, fail_at: int = 0) -> None:
        self.calls: list[dict] = []
        self.fail_at = fail_at

    def __call__(self, argv: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        self.calls.append({"argv": argv, **kwargs})
        return subprocess.CompletedProcess(argv, 3 if len(self.calls) == self.fail_at else 0)


def test_run_calls_each_script_in_order_from_the_root_and_stops_at_a_failure(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    ran = Recorder()
    monkeypatch.setattr(cli, "subprocess", SimpleNamespace(run=ran))
    assert cli.main(["run", "quick"]) == 0
    assert [" ".join(c["argv"][1:]) for c in ran.calls] == MAKE_BENCH_BEFORE
    assert all(c["argv"][0] == sys.executable and c["cwd"] == ROOT for c in ran.calls)
    assert all(c["env"]["OMP_WAIT_POLICY"] == "PASSIVE" for c in ran.calls)

    failing = Recorder(fail_at=1)
    monkeypatch.setattr(cli, "subprocess", SimpleNamespace(run=failing))
    assert cli.main(["run", "quick"]) == 3
    assert len(failing.calls) == 1
    assert "benchmarks/cache_latency.py failed with exit code 3" in capsys.readouterr().err
