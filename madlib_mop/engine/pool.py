"""Running worker calls concurrently: one thread per worker, results on one queue.

PL/Python allows plpy only in the backend's main thread, so the threads touch no plpy:
each holds one `Worker` and runs the calls given to it one at a time, and the caller (in
the main thread) collects the results, polling so that a cancel of its own statement
takes effect.  Engine-independent: it only calls the `Worker` contract.
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable

from madlib_mop.engine.base import Worker, as_error


class WorkerThread(threading.Thread):
    def __init__(self, worker: Worker, results: queue.Queue):
        super().__init__(daemon=True, name=f"madlib_mop worker {worker.segment}")
        self.worker, self.results, self.inbox = worker, results, queue.Queue()
        self.close_worker = True
        self.running = False  # a call runs now

    @property
    def busy(self) -> bool:
        """Running a call, or with calls waiting (a new session importing TensorFlow)."""
        return self.running or not self.inbox.empty()

    def run(self) -> None:
        while True:
            item = self.inbox.get()
            if item is None:
                break
            tag, call, report = item
            self.running = True
            try:
                value = call(self.worker)
                if report:
                    self.results.put((tag, value, None))
            except Exception as error:  # reported to the caller, which decides
                if report:
                    self.results.put((tag, None, error))
            finally:
                self.running = False
        if self.close_worker:
            self.worker.close()

    def submit(self, tag: Any, call: Callable[[Worker], Any], report: bool = True) -> None:
        self.inbox.put((tag, call, report))

    def stop(self) -> None:
        """Cancel what runs, drop the calls waiting (nobody collects them now), end."""
        while True:
            try:
                self.inbox.get_nowait()
            except queue.Empty:
                break
        self.worker.cancel()
        self.inbox.put(None)

    def release(self) -> None:
        """End the thread after its last call, leaving the worker's session open."""
        self.close_worker = False
        self.inbox.put(None)


class WorkerPool:
    """One thread per worker; `results` receives (tag, value, error) per reported call."""

    def __init__(self, workers: list[Worker]):
        self.results: queue.Queue = queue.Queue()
        self.ended = False
        self.retired: set[int] = set()
        self.threads = [WorkerThread(w, self.results) for w in workers]
        for thread in self.threads:
            thread.start()

    def submit(self, index: int, tag: Any, call: Callable[[Worker], Any], report: bool = True) -> None:
        self.threads[index].submit(tag, call, report)

    def add(self, worker: Worker) -> int:
        """One more worker (a job that got another session of the server's pool): its index."""
        thread = WorkerThread(worker, self.results)
        thread.start()
        self.threads.append(thread)
        return len(self.threads) - 1

    def retire(self, index: int) -> None:
        """Close a worker that runs nothing (its slot goes back to the server's pool)."""
        self.retired.add(index)
        self.threads[index].stop()

    def live(self) -> list[int]:
        return [i for i in range(len(self.threads)) if i not in self.retired]

    def ready(self) -> list[int]:
        """The live workers running nothing now, or all live ones when every one is busy
        (then none is readier than another)."""
        live = self.live()
        return [i for i in live if not self.threads[i].busy] or live

    def workers(self) -> list[Worker]:
        return [self.threads[i].worker for i in self.live()]

    def next_result(self, timeout: float) -> tuple[Any, Any, BaseException | None] | None:
        try:
            return self.results.get(timeout=timeout)
        except queue.Empty:
            return None

    def call(self, call: Callable[[Worker], Any], poll: Callable[[], None]) -> Any:
        """`call` on one live worker, waited for: it runs after what that worker runs now.
        Results of the job's other calls that arrive meanwhile are put back, in order, for
        the job to collect.  Raises what the call raised."""
        return self.call_each([call], poll)[0]

    def call_each(self, calls: list[Callable[[Worker], Any]], poll: Callable[[], None],
                  indexes: list[int] | None = None) -> list[Any]:
        """Call i on worker indexes[i] (default: the live workers in turn), all waited for:
        each runs after what its worker runs now.  Results of the job's other calls that
        arrive meanwhile are put back, in order, for the job to collect.  Once every call
        has ended, raises the error of the first call (in the calls' order) that failed."""
        indexes = self.live() if indexes is None else indexes
        if len(calls) > len(indexes):
            raise ValueError(f"{len(calls)} calls for {len(indexes)} workers")
        tags = [("call", object()) for _ in calls]
        for index, tag, call in zip(indexes, tags, calls):
            self.submit(index, tag, call)
        found: dict[int, tuple[Any, BaseException | None]] = {}
        others = []
        try:
            while len(found) < len(tags):
                got = self.next_result(0.25)
                if got is None:
                    poll()
                    continue
                mine = [i for i, tag in enumerate(tags) if got[0] is tag]
                if mine:
                    found[mine[0]] = (got[1], got[2])
                else:
                    others.append(got)
        finally:
            for item in others:
                self.results.put(item)
        for _, error in (found[i] for i in range(len(tags))):
            if error is not None:
                raise error
        return [found[i][0] for i in range(len(tags))]

    def stop(self) -> None:
        """Cancel what runs and close the workers' sessions (once: not after `release`)."""
        if self.ended:
            return
        self.ended = True
        for index in self.live():
            self.threads[index].stop()

    def release(self) -> None:
        """Nothing runs any more: end the threads and keep the sessions open (the engine may
        give the workers to this session's next job)."""
        self.ended = True
        for index in self.live():
            self.threads[index].release()
        for thread in self.threads:
            thread.join(timeout=30)


def run_all(workers: list[Worker], calls: list[Callable[[Worker], Any]],
            poll: Callable[[], None]) -> list[Any]:
    """The calls over the workers, concurrently: call i on worker i, or, with fewer workers
    than calls (the server's pool is short; the workers are then interchangeable), each
    worker runs the next call not taken yet; the results in the calls' order.  `poll` runs
    in the caller's thread while waiting (it lets a cancel of the caller take effect).  The
    first failure is raised, as a MadlibMopError, after every call has ended; workers are
    kept open (an engine may reuse them)."""
    results: list[Any] = [None] * len(calls)
    failures: list[BaseException] = []
    pending: queue.SimpleQueue = queue.SimpleQueue()
    for index in range(len(calls)):
        pending.put(index)

    def run(index: int, worker: Worker) -> None:
        try:
            results[index] = calls[index](worker)
        except BaseException as error:  # raised below, in the caller's thread
            failures.append(error)

    def work(worker: Worker, bound: int | None) -> None:
        if bound is not None:
            return run(bound, worker)
        while not failures:
            try:
                index = pending.get_nowait()
            except queue.Empty:
                return
            run(index, worker)

    one_each = len(workers) >= len(calls)
    threads = [threading.Thread(target=work, args=(w, i if one_each else None), daemon=True)
               for i, w in enumerate(workers[:len(calls)])]
    for thread in threads:
        thread.start()
    try:
        while any(t.is_alive() for t in threads):
            for thread in threads:
                thread.join(timeout=0.5)
            poll()
    except BaseException:
        for worker in workers:
            worker.cancel()
        for thread in threads:  # the caller may close the workers: not while one runs
            thread.join(timeout=30)
        raise
    if failures:
        raise as_error(failures[0])
    return results
