"""Single flight across threads (``SingleFlight``) and leases on real fsspec filesystems (``LeaseLock``)."""

from __future__ import annotations

import json
import threading
import time
import uuid

import fsspec
import pytest

from homer_integrations.cache.flight import LeaseLock, LockTimeout, SingleFlight, create_exclusive
from tests.test_document_cache import wait_for


def test_threads_share_one_work_and_keep_runs_before_the_flight_ends() -> None:
    flight: SingleFlight[str] = SingleFlight()
    kept: dict[str, str] = {}
    calls = []

    def work() -> str:
        calls.append(1)
        wait_for(lambda: flight.waits == 5)
        return "value"

    results = []

    def ask() -> None:
        results.append(flight.run("k", lambda: kept.get("k"), work, lambda v: kept.__setitem__("k", v)))

    threads = [threading.Thread(target=ask) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert len(calls) == 1 and kept == {"k": "value"}
    assert sorted(role for _, role in results) == ["follower"] * 5 + ["leader"]
    assert flight.run("k", lambda: kept.get("k"), pytest.fail, pytest.fail) == ("value", "cached")


def test_an_error_reaches_every_follower_and_the_next_call_retries() -> None:
    flight: SingleFlight[str] = SingleFlight()
    release = threading.Event()

    def failing() -> str:
        release.wait(10)
        raise RuntimeError("boom")

    errors = []

    def ask() -> None:
        try:
            flight.run("k", lambda: None, failing, lambda v: None)
        except RuntimeError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=ask) for _ in range(3)]
    for t in threads:
        t.start()
    wait_for(lambda: flight.waits == 2)
    release.set()
    for t in threads:
        t.join(10)
    assert len(errors) == 3
    assert flight.run("k", lambda: None, lambda: "ok", lambda v: None) == ("ok", "leader")


@pytest.fixture(params=["memory", "file", "s3"])
def lease_fs(request: pytest.FixtureRequest, tmp_path) -> tuple[fsspec.AbstractFileSystem, str]:
    """(filesystem, folder) for leases on each kind of store."""
    if request.param == "memory":
        return fsspec.filesystem("memory"), f"/leases-{uuid.uuid4().hex[:8]}"
    if request.param == "file":
        return fsspec.filesystem("file"), str(tmp_path)
    url = request.getfixturevalue("s3_url")
    fs, root = fsspec.core.url_to_fs(url)
    return fs, root


def test_exclusive_create_refuses_a_taken_name(lease_fs) -> None:
    fs, root = lease_fs
    create_exclusive(fs, f"{root}/x.lease", b"first")
    with pytest.raises(FileExistsError):
        create_exclusive(fs, f"{root}/x.lease", b"second")
    assert bytes(fs.cat_file(f"{root}/x.lease")) == b"first"


def test_a_lease_admits_one_holder_at_a_time(lease_fs) -> None:
    fs, root = lease_fs
    path = f"{root}/k.lease"
    inside, most, entries = [0], [0], []
    guard = threading.Lock()

    def hold(i: int) -> None:
        lock = LeaseLock(fs, path, ttl=5.0, poll=0.01)
        lock.acquire()
        try:
            with guard:
                inside[0] += 1
                most[0] = max(most[0], inside[0])
            time.sleep(0.05)
            entries.append(i)
            with guard:
                inside[0] -= 1
        finally:
            lock.release()

    threads = [threading.Thread(target=hold, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(entries) == [0, 1, 2, 3] and most[0] == 1
    assert not fs.exists(path)  # released


def test_a_held_lease_is_renewed_and_times_a_waiter_out(lease_fs) -> None:
    fs, root = lease_fs
    path = f"{root}/k.lease"
    holder = LeaseLock(fs, path, ttl=2.0)  # a ttl that a loaded machine's scheduler cannot stall the heartbeat past
    holder.acquire()
    try:
        first = bytes(fs.cat_file(path))
        waiter = LeaseLock(fs, path, ttl=2.0, timeout=3.0, poll=0.02)
        with pytest.raises(LockTimeout):
            waiter.acquire()  # 3 s > ttl: only the heartbeat keeps the lease from looking stale
        assert bytes(fs.cat_file(path)) != first
        assert json.loads(fs.cat_file(path))["owner"] == holder.owner
    finally:
        holder.release()


def test_a_dead_holders_lease_is_broken(lease_fs) -> None:
    fs, root = lease_fs
    path = f"{root}/k.lease"
    fs.pipe_file(path, json.dumps({"owner": "dead:1:x", "expires": time.time() + 0.3}).encode())
    started = time.monotonic()
    lock = LeaseLock(fs, path, ttl=0.3, timeout=10, poll=0.02)
    lock.acquire()
    try:
        assert time.monotonic() - started < 5
        assert json.loads(fs.cat_file(path))["owner"] == lock.owner
    finally:
        lock.release()
