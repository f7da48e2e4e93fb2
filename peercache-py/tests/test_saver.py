"""The vLLM connector's save queue (peercache.vllm.saver) with a put that the test holds, so
every ordering is forced rather than raced: a finished request is reported only after its
batches ended, a preempted one is waited for, a failing put is counted, shutdown drains."""

from __future__ import annotations

import threading
from typing import List, Sequence, Tuple

from peercache.core import Segments
from peercache.vllm.saver import SaveJob, SaveQueue


class HeldPut:
    """A put that blocks until the test releases it; records what it was given."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.calls: List[List[str]] = []
        self.fail = False

    def __call__(self, keys: Sequence[str], segs: Segments) -> List[bool]:
        assert self.gate.wait(10), "the test never released the put"
        self.calls.append(list(keys))
        if self.fail:
            raise RuntimeError("pool full")
        return [True] * len(keys)


def job(keys: List[str], *reqs: str) -> SaveJob:
    return SaveJob(keys, Segments(), list(reqs))


def test_a_finished_request_is_reported_only_after_its_saves_ended_and_once():
    put, done = HeldPut(), []
    q = SaveQueue(put, lambda j, ok, t: done.append((sum(ok), len(ok) - sum(ok))))
    q.submit(job(["a", "b"], "r1", "r1"))
    q.submit(job(["c"], "r2"))
    assert q.finished(["r1", "r2", "r3"]) == {"r3"}, "r3 had no batch in flight"
    put.gate.set()
    assert q.wait_for(["r1", "r2"], 10)
    assert q.finished([]) == {"r1", "r2"}
    assert q.finished([]) == set(), "each request is reported once"
    assert put.calls == [["a", "b"], ["c"]], "batches run in submission order"
    assert done == [(2, 0), (1, 0)]
    assert q.close(10)


def test_waiting_for_a_preempted_request_ends_at_its_deadline_while_the_put_is_held():
    put = HeldPut()
    q = SaveQueue(put, lambda j, ok, t: None)
    q.submit(job(["a"], "r1"))
    assert not q.wait_for(["r1"], 0.05), "still in flight: the deadline ends the wait"
    assert q.wait_for(["other"], 0.05), "a request without batches never waits"
    put.gate.set()
    assert q.wait_for(["r1"], 10)
    assert q.in_flight() == 0
    assert q.close(10)


def test_a_failing_put_counts_its_pages_as_failed_and_releases_the_request():
    put, done = HeldPut(), []
    put.fail = True
    put.gate.set()
    q = SaveQueue(put, lambda j, ok, t: done.append((sum(ok), len(ok) - sum(ok))))
    q.submit(job(["a", "b", "c"], "r1"))
    assert q.wait_for(["r1"], 10)
    assert done == [(0, 3)]
    assert q.finished(["r1"]) == {"r1"}
    assert q.close(10)


def test_close_lets_queued_batches_end_within_its_deadline():
    put = HeldPut()
    q = SaveQueue(put, lambda j, ok, t: None)
    q.submit(job(["a"], "r1"))
    assert not q.close(0.05), "the put is held: close reports it did not drain"
    put.gate.set()
    results: Tuple[bool, ...] = (q.wait_for(["r1"], 10),)
    assert results == (True,)
