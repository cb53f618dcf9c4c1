"""Running the engine's blocking calls from asyncio without blocking the event loop."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TypeVar

T = TypeVar("T")

_END = object()


async def iterate_in_thread(make: Callable[[], Iterator[T]]) -> AsyncIterator[T]:
    """Run ``make()`` and its iteration in a worker thread; hand the items over through a queue.

    Closing the async iterator early asks the worker to stop after the item it is producing.
    """
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[object, BaseException | None]] = asyncio.Queue()
    stop = threading.Event()

    def put(item: object, error: BaseException | None = None) -> None:
        try:
            loop.call_soon_threadsafe(queue.put_nowait, (item, error))
        except RuntimeError:  # the loop closed while the worker ran: nobody is listening
            stop.set()

    def work() -> None:
        iterator: Iterator[T] | None = None
        try:
            iterator = make()
            for item in iterator:
                if stop.is_set():
                    break
                put(item)
        except BaseException as exc:
            put(_END, exc)
        else:
            put(_END)
        finally:
            close = getattr(iterator, "close", None)  # release a generator the consumer abandoned
            if close is not None:
                close()

    worker = loop.run_in_executor(None, work)
    try:
        while True:
            item, error = await queue.get()
            if item is _END:
                if error is not None:
                    raise error
                break
            yield item  # type: ignore[misc]
        await worker
    finally:
        stop.set()
