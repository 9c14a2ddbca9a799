"""Let gloo's worker threads finish before the interpreter shuts down.

A gloo process group runs each collective on one of its worker threads. When the collective
is done the waiting caller wakes up, and the worker then drops its reference to the work, and
with it the work's tensors. If a tensor also has a Python object, dropping it takes the GIL.
The worker may not get there before the caller's script has ended: a compiled graph's last
``all_reduce`` (whose work only the worker still holds after ``wait_tensor``), then a
print and ``destroy_process_group()``. A thread that asks for the GIL once Python is
finalizing is ended by the interpreter. Ending a thread inside that C++ destructor aborts the
process ("terminate called without an active exception", SIGABRT): the rank fails after its
script succeeded.
``destroy_process_group()`` does not prevent it: the group's worker threads stop only when its
last reference goes, and a graph compiled over the group keeps one (Dynamo stores the group's
object with the graph).

:func:`drain_gloo_workers` gives the GIL away until no such thread is left;
:func:`drain_at_exit` runs it from ``atexit``, which Python calls before it starts finalizing.
Registered when the ``torch_npu`` emulation creates a gloo group, and when a graph with a
collective on one is compiled or loaded from ``cache_compile``.
"""
from __future__ import annotations

import atexit
import ctypes
import os
import sys
import threading
import time

from torchair.base.log import logger

__all__ = ["drain_at_exit", "drain_at_exit_for", "drain_gloo_workers", "pending_gil_threads",
           "runnable_native_threads"]

_registered = False
_lock = threading.Lock()
_api: ctypes.PyDLL | None = None


def _python_api() -> ctypes.PyDLL:
    global _api
    if _api is None:
        api = ctypes.pythonapi
        api.PyInterpreterState_Main.restype = ctypes.c_void_p
        api.PyInterpreterState_Main.argtypes = []
        api.PyInterpreterState_ThreadHead.restype = ctypes.c_void_p
        api.PyInterpreterState_ThreadHead.argtypes = [ctypes.c_void_p]
        api.PyThreadState_Next.restype = ctypes.c_void_p
        api.PyThreadState_Next.argtypes = [ctypes.c_void_p]
        _api = api
    return _api


def pending_gil_threads() -> int:
    """How many threads hold a Python thread state but run no Python code: C++ threads (a gloo
    worker dropping a tensor) waiting for the GIL, or inside a short section that holds it.

    Counted as the interpreter's thread states minus the threads that have a Python frame
    (``sys._current_frames``); called with the GIL held, so no state is deleted meanwhile.
    """
    api = _python_api()
    count = 0
    state = api.PyInterpreterState_ThreadHead(api.PyInterpreterState_Main())
    while state:
        count += 1
        state = api.PyThreadState_Next(state)
    return max(0, count - len(sys._current_frames()))


def runnable_native_threads() -> int:
    """How many of this process's threads that Python did not start are running or ready to
    run (state ``R`` in ``/proc/self/task``): a gloo worker between finishing a collective and
    dropping it. 0 where ``/proc`` is not there."""
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return 0
    python = {t.native_id for t in threading.enumerate()}
    python.add(threading.get_native_id())
    count = 0
    for tid in tasks:
        if not tid.isdigit() or int(tid) in python:
            continue
        try:
            with open(f"/proc/self/task/{tid}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue  # the thread ended
        end = stat.rfind(b")")  # the name in parentheses may hold anything; the state follows
        count += stat[end + 2:end + 3] == b"R"
    return count


def drain_gloo_workers(budget_s: float = 1.0, quiet_s: float = 0.01, poll_s: float = 0.002
                       ) -> bool:
    """Give the GIL away (short sleeps) until, over ``quiet_s``, no thread waits for it
    (:func:`pending_gil_threads`) and no thread outside Python is runnable
    (:func:`runnable_native_threads`). Returns True once quiet, False after ``budget_s``
    (then the process carries on: a thread that keeps a state, such as a library's own C
    thread, only costs the budget)."""
    start = time.monotonic()
    quiet_since: float | None = None
    while True:
        now = time.monotonic()
        busy = pending_gil_threads() or runnable_native_threads()
        if busy:
            quiet_since = None
        elif quiet_since is None:
            quiet_since = now
        elif now - quiet_since >= quiet_s:
            logger.debug("gloo workers quiet after %.1f ms", (now - start) * 1e3)
            return True
        if now - start >= budget_s:
            logger.debug("gloo workers: %d thread(s) still waiting for the GIL or running after "
                         "%.1f s; exiting anyway", pending_gil_threads() + runnable_native_threads(),
                         budget_s)
            return False
        time.sleep(poll_s)


def drain_at_exit() -> None:
    """Run :func:`drain_gloo_workers` when the interpreter exits (``atexit``: before Python
    finalizes); registered once per process."""
    global _registered
    with _lock:
        if _registered:
            return
        _registered = True
    atexit.register(drain_gloo_workers)


def drain_at_exit_for(backend: object) -> None:
    """:func:`drain_at_exit` when ``backend`` (a process group's backend name, such as "gloo" or
    "cpu:gloo,cuda:nccl") runs on gloo."""
    if "gloo" in str(backend).lower():
        drain_at_exit()
