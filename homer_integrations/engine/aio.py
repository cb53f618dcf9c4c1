"""Driving the engine's blocking iterators from asyncio without blocking the event loop."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class ThreadedIterator(AsyncIterator[T], Generic[T]):
    """Async iteration over ``make()``, which is called and iterated in a worker thread.

    Items cross to the event loop through a queue as they are produced. ``source`` is the
    iterator ``make()`` returned (e.g. an ``AnswerStream`` whose ``info`` is read at the end).
    ``aclose()`` (or leaving an ``async for`` early) makes the worker stop after its current
    item.
    """

    _DONE = object()

    def __init__(self, make: Callable[[], Iterator[T]]) -> None:
        self._make = make
        self.source: Iterator[T] | None = None
        self._queue: asyncio.Queue[tuple[object, BaseException | None]] | None = None
        self._stop = threading.Event()
        self._worker: asyncio.Future[None] | None = None
        self._finished = False

    def _run(self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue) -> None:
        def hand_over(item: object, error: BaseException | None = None) -> None:
            if not loop.is_closed():
                loop.call_soon_threadsafe(queue.put_nowait, (item, error))

        try:
            self.source = self._make()
            for item in self.source:
                hand_over(item)
                if self._stop.is_set():
                    break
        except BaseException as exc:  # handed to the consumer, raised there
            hand_over(self._DONE, exc)
        else:
            hand_over(self._DONE)

    def __aiter__(self) -> ThreadedIterator[T]:
        return self

    async def __anext__(self) -> T:
        if self._queue is None:
            loop = asyncio.get_running_loop()
            self._queue = asyncio.Queue()
            self._worker = loop.run_in_executor(None, self._run, loop, self._queue)
        if self._finished:
            raise StopAsyncIteration
        item, error = await self._queue.get()
        if item is self._DONE:
            self._finished = True
            await self._worker  # type: ignore[misc]
            if error is not None:
                raise error
            raise StopAsyncIteration
        return item  # type: ignore[return-value]

    async def aclose(self) -> None:
        # no waiting here: a worker still compressing finishes in the background (and caches)
        self._stop.set()


async def iterate_in_thread(make: Callable[[], Iterator[T]]) -> AsyncIterator[T]:
    """``async for item in iterate_in_thread(make)``: ``ThreadedIterator`` as an async generator."""
    it = ThreadedIterator(make)
    try:
        async for item in it:
            yield item
    finally:
        await it.aclose()
