"""Publishing off the forward pass: one background thread runs the workers' save batches in
order, while vLLM goes on computing. vLLM keeps a finished request's blocks until
:meth:`SaveQueue.finished` reports its saves done, and a preempted request's saves end
before its blocks can be reused (:meth:`SaveQueue.wait_for`)."""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Set

from ..core import Segments

logger = logging.getLogger("vllm.peercache")

# put(keys, segments) -> one flag per page
PutFn = Callable[[Sequence[str], Segments], List[bool]]
# done(the batch, one flag per page, seconds)
DoneFn = Callable[["SaveJob", List[bool], float], None]


@dataclass
class SaveJob:
    """One step's save batch: page ``i`` of ``keys`` from its segments, for ``req_ids``;
    ``hashes[i]`` is page ``i``'s page hash (what KV events name)."""

    keys: List[str]
    segs: Segments
    req_ids: List[str]
    hashes: List[str] = field(default_factory=list)
    # Staging-mirror slots the pages are in, given back once the put ended.
    slots: List[int] = field(default_factory=list)


class SaveQueue:
    """Save batches run in submission order on one thread; each request's batches in flight
    are counted, so vLLM learns when a finished request's blocks are free."""

    def __init__(self, put: PutFn, done: DoneFn) -> None:
        self._put = put
        self._done = done
        self._jobs: "queue.Queue[Optional[SaveJob]]" = queue.Queue()
        self._cond = threading.Condition()
        self._pending: Dict[str, int] = {}  # request -> save batches not yet ended
        self._delayed: Set[str] = set()     # finished requests vLLM waits on
        self._thread = threading.Thread(target=self._run, name="peercache-save", daemon=True)
        self._thread.start()

    def submit(self, job: SaveJob) -> None:
        """Queues one batch; returns at once."""
        with self._cond:
            for r in set(job.req_ids):
                self._pending[r] = self._pending.get(r, 0) + 1
        self._jobs.put(job)

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            t0 = time.perf_counter()
            try:
                ok = self._put(job.keys, job.segs)
            except Exception as e:  # a full pool or a node down costs future hits, nothing else
                logger.warning("peercache: %d block(s) not published (%s)", len(job.keys), e)
                ok = [False] * len(job.keys)
            try:
                self._done(job, ok, time.perf_counter() - t0)
            finally:
                with self._cond:
                    for r in set(job.req_ids):
                        left = self._pending.get(r, 0) - 1
                        if left > 0:
                            self._pending[r] = left
                        else:
                            self._pending.pop(r, None)
                    self._cond.notify_all()

    def wait_for(self, req_ids: Iterable[str], timeout: float) -> bool:
        """Waits until no batch of ``req_ids`` is in flight (at most ``timeout`` s); False on
        the deadline."""
        want = set(req_ids)
        deadline = time.monotonic() + timeout
        with self._cond:
            while any(r in self._pending for r in want):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def finished(self, delayed: Iterable[str]) -> Set[str]:
        """Adds the finished requests vLLM now waits on; returns those (of every call so far)
        whose saves have all ended, once each."""
        with self._cond:
            self._delayed.update(delayed)
            done = {r for r in self._delayed if r not in self._pending}
            self._delayed -= done
        return done

    def in_flight(self) -> int:
        """Requests with a batch in flight."""
        with self._cond:
            return len(self._pending)

    def close(self, timeout: float) -> bool:
        """Lets the queued batches end (at most ``timeout`` s), then stops the thread. False
        when batches were still running at the deadline."""
        self._jobs.put(None)
        self._thread.join(timeout)
        return not self._thread.is_alive()
