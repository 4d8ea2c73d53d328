"""One communication thread per process group: how a collective returns before it is done.

torch's DDP starts each gradient bucket's all-reduce from an autograd hook and only waits
for all of them after backward (``Reducer::finalize_backward``), so a backend whose calls
block serialises communication after computation. Here a call checks its arguments on the
caller's thread (so a mistake raises where it was made), then queues the job for the
group's thread and returns a ``Work`` whose future the thread completes. Jobs run one at a
time in the order they were issued, which every rank does alike, so the ranks' collectives
on a group meet in the same order as if they ran on the caller's thread, bit for bit.
Jobs run without autograd (``torch.no_grad``), as gloo's C++ does: DDP with
``create_graph=True`` hands over buckets that require grad. The thread is a daemon: a
rank that exits with work queued does not hang.
"""

from __future__ import annotations

import queue
import threading

import torch
from torch.futures import Future

from . import torch_private


class GroupWorker:
    """A queue of jobs and the thread that runs them in order."""

    def __init__(self, name: str):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, job, result):
        """Queue ``job()``; returns a Work completed with ``result`` once the job has run
        (or failed with its exception)."""
        fut = Future()
        self._jobs.put((job, result, fut))
        return torch_private.work_from_future(fut)

    def run(self, job):
        """Run ``job()`` on the thread after everything queued before it; wait for it and
        return its value (split and barrier-like calls that need their answer now)."""
        fut = Future()
        self._jobs.put((job, None, fut))
        return fut.wait()

    def close(self) -> None:
        self._jobs.put(None)

    def _run(self) -> None:
        while True:
            item = self._jobs.get()
            if item is None:
                return
            job, result, fut = item
            try:
                with torch.no_grad():  # as gloo's: a collective is not recorded by autograd
                    value = job()
            except BaseException as e:  # noqa: BLE001 (handed to whoever waits)
                fut.set_exception(e)
                continue
            fut.set_result(value if result is None else result)
