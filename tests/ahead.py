"""Start the next test's slow job while this one's runs: one job ahead, in the tests' own order.

A graded notebook spends a good part of its time waiting, not computing: a kernel starting, an attack's hang
running into its time limit, lab 07's simulated stages sleeping. Under ``pytest -n 2`` a worker that waits
leaves one of the two cores idle, and a run of such tests left a fifth of ``make test``'s core-seconds idle.
:class:`Ahead` runs the job of the *next* test of the same test function (in the order the worker will run
them) in a thread while the current test waits for its own; each test still asserts on its own job's result,
as before. So at most two jobs run at once per worker, and a job never waits behind one that came later.

Use it only for jobs that are independent of one another and of the test's function-scoped fixtures (a job
gets its folder from ``tmp_path_factory``), and whose time limits hold on a busy machine. A job's exception is
raised in its own test. If the run stops early, at most one job ahead has started and it is waited for.
``make test`` distributes whole files (``--dist loadfile``), so a module's tests all run on one worker; under
another distribution a job run ahead may be one this worker never needs: time lost, never a wrong result.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Hashable

__all__ = ["Ahead"]


class Ahead:
    """``Ahead(job, key)``: ``result(request)`` is ``job(key(param))`` for the current test's parameter
    ``param`` (its ``argname``), with the job of the next key of the same test function already started.

    Tests that share a key share one job (e.g. every fixture of one lab shares the lab's kernel).
    """

    def __init__(self, job: Callable[[Hashable], object], argname: str,
                 key: Callable[[object], Hashable] = lambda p: p):
        self.job, self.argname, self.key = job, argname, key
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="gpucourse-ahead")
        self._lock = threading.Lock()
        self._jobs: dict[Hashable, Future] = {}
        self._order: list[Hashable] | None = None

    def _keys_in_order(self, request) -> list[Hashable]:
        """The keys of this test function's items that this worker holds, in the order it runs them."""
        keys: list[Hashable] = []
        for item in request.session.items:
            # (nbval's notebook cells are items too, with neither a module nor an originalname)
            if getattr(item, "module", None) is request.module and getattr(item, "originalname", None) == \
                    request.node.originalname:
                k = self.key(item.callspec.params[self.argname])
                if k not in keys:
                    keys.append(k)
        return keys

    def _start(self, k: Hashable) -> Future:
        if k not in self._jobs:
            self._jobs[k] = self._pool.submit(self.job, k)
        return self._jobs[k]

    def result(self, request):
        """The current test's job's result (its exception, raised here), with the next key's job started."""
        k = self.key(request.node.callspec.params[self.argname])
        with self._lock:
            if self._order is None:
                self._order = self._keys_in_order(request)
            mine = self._start(k)
            if k in self._order and self._order.index(k) + 1 < len(self._order):
                self._start(self._order[self._order.index(k) + 1])
        return mine.result()

    def close(self) -> None:
        """Drop the jobs not started; wait for a started one (a kernel is never left running)."""
        self._pool.shutdown(wait=True, cancel_futures=True)
