"""``RecentIndexes``: a document's statements and passages, built once and kept for its next questions."""

from __future__ import annotations

import threading
import time

from homer_integrations.engine.builder import RecentIndexes


def test_an_index_is_built_once_whatever_threads_ask_and_the_oldest_goes_first() -> None:
    indexes, builds = RecentIndexes(size=2), []

    def build() -> object:
        builds.append(1)
        time.sleep(0.05)  # long enough for the other threads to ask meanwhile
        return object()

    found: list[object] = []
    threads = [threading.Thread(target=lambda: found.append(indexes.get(("a",), build))) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(builds) == 1 and len({id(f) for f in found}) == 1, "built once, the same index for every thread"
    indexes.get(("b",), object)
    indexes.get(("a",), build)  # used again: now the newest
    indexes.get(("c",), object)
    assert len(builds) == 1 and indexes.get(("a",), build) is found[0], "the least recently used, b, went"
    fresh = indexes.get(("b",), object)
    assert fresh is not None and len(builds) == 1
