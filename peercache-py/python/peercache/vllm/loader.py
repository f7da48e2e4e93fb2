"""Loading between scheduler steps (``load_async``): one background thread runs each step's
asynchronous loads in order while vLLM goes on computing other requests; a request whose load
ended (landed or not) is reported once through :meth:`LoadQueue.finished`, after the blocks
that failed were recorded for ``get_block_ids_with_load_errors``."""

from __future__ import annotations

import logging
import queue
import threading
from typing import Callable, List, Optional, Set

from .meta import BlockIO

logger = logging.getLogger("vllm.peercache")

# load(ios): reads the pages of ``ios`` into their blocks and records every block that did not
# land; never raises for a miss.
LoadFn = Callable[[List[BlockIO]], None]


class LoadQueue:
    """One step's asynchronous loads are one job; jobs run in submission order on one thread."""

    def __init__(self, load: LoadFn) -> None:
        self._load = load
        self._jobs: "queue.Queue[Optional[List[BlockIO]]]" = queue.Queue()
        self._lock = threading.Lock()
        self._done: Set[str] = set()
        self._thread = threading.Thread(target=self._run, name="peercache-load", daemon=True)
        self._thread.start()

    def submit(self, ios: List[BlockIO]) -> None:
        """Queues one step's loads; returns at once."""
        if ios:
            self._jobs.put(ios)

    def _run(self) -> None:
        while True:
            ios = self._jobs.get()
            if ios is None:
                return
            try:
                self._load(ios)
            except Exception as e:  # never leave vLLM waiting: the request is reported anyway
                logger.warning("peercache: an asynchronous load failed (%s)", e)
            finally:
                with self._lock:
                    self._done.update(io.req_id for io in ios)

    def finished(self) -> Set[str]:
        """Requests whose load ended since the last call (each once)."""
        with self._lock:
            out, self._done = self._done, set()
        return out

    def close(self, timeout: float) -> bool:
        """Lets queued loads end (at most ``timeout`` s), then stops the thread."""
        self._jobs.put(None)
        self._thread.join(timeout)
        return not self._thread.is_alive()
