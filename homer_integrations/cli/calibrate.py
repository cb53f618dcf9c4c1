"""``homer-qa calibrate``: compute (once) and store a model's pruning calibration."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from homer_integrations.cli import loading, options
from homer_integrations.cli.common import EXIT_OK, seconds


def add_parser(commands: Any) -> None:
    calibrate = commands.add_parser("calibrate", help="compute (once) the pruning calibration of a model")
    calibrate.set_defaults(run=run)
    options.model_options(calibrate)
    options.homer_options(calibrate, warmup=False, split=False)


def run(args: argparse.Namespace) -> int:
    engine = loading.engine(args, options.config(args), None, progress=None)
    if not engine.needs_calibration:
        sys.stdout.write("this configuration uses no calibration\n")
        return EXIT_OK
    started = time.perf_counter()
    where = engine.calibrate()
    took = time.perf_counter() - started
    sys.stdout.write(
        f"calibration for {engine.model_name} (max_chunk_len={engine.config.max_chunk_len}) "
        f"ready in {seconds(took)}: {where or 'kept in memory'}\n"
    )
    return EXIT_OK
