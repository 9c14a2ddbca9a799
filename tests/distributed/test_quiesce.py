"""The exit drain for gloo's worker threads (torchair.distributed.quiesce).

The crash it prevents (a gloo worker asking for the GIL while Python finalizes: SIGABRT after the
script succeeded) depends on thread timing, so these tests build its parts deterministically with
a small C library: a thread that holds a Python thread state but runs no Python code (what a C++
worker dropping a tensor does), and a busy native thread. The end-to-end run is
tests/distributed/test_tp_launch.py (both ranks log that their drain ran).
"""
import atexit
import ctypes
import os
import shutil
import subprocess
import sys
import sysconfig
import threading
import time

import pytest
import torch
import torch.distributed as dist

from torchair import compat
from torchair.distributed import quiesce

HELPER = r"""
#include <Python.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>

static pthread_t holder, spinner;
static int holder_fd;
static long spin_ms;

static void *hold(void *arg) {
    PyGILState_STATE state = PyGILState_Ensure();  /* a thread state, and no Python frame */
    Py_BEGIN_ALLOW_THREADS
    char c;
    if (read(holder_fd, &c, 1) < 0) { /* released either way */ }
    Py_END_ALLOW_THREADS
    PyGILState_Release(state);
    return NULL;
}

static void *spin(void *arg) {
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    do { clock_gettime(CLOCK_MONOTONIC, &b); }
    while ((b.tv_sec - a.tv_sec) * 1000L + (b.tv_nsec - a.tv_nsec) / 1000000L < spin_ms);
    return NULL;
}

int start_holder(int fd) { holder_fd = fd; return pthread_create(&holder, NULL, hold, NULL); }
int join_holder(void) { return pthread_join(holder, NULL); }
int start_spinner(long ms) { spin_ms = ms; return pthread_create(&spinner, NULL, spin, NULL); }
int join_spinner(void) { return pthread_join(spinner, NULL); }
"""


@pytest.fixture(scope="module")
def helper(tmp_path_factory):
    compiler = os.environ.get("CC", "cc")
    if shutil.which(compiler) is None:
        pytest.skip(f"no C compiler ({compiler}) to build the thread helper")
    folder = tmp_path_factory.mktemp("quiesce")
    (folder / "helper.c").write_text(HELPER)
    subprocess.run([compiler, "-shared", "-fPIC", "-O1", "-pthread",
                    f"-I{sysconfig.get_paths()['include']}", str(folder / "helper.c"),
                    "-o", str(folder / "helper.so")], check=True, capture_output=True)
    lib = ctypes.CDLL(str(folder / "helper.so"))
    lib.start_spinner.argtypes = [ctypes.c_long]
    return lib


def _wait_for(predicate, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.001)


def _hold_a_thread_state(helper):
    """Start the holder thread; returns the pipe end whose write lets it go."""
    read_end, write_end = os.pipe()
    base = quiesce.pending_gil_threads()
    assert helper.start_holder(read_end) == 0
    _wait_for(lambda: quiesce.pending_gil_threads() == base + 1)
    return read_end, write_end


def _release(helper, read_end, write_end):
    os.write(write_end, b"x")
    assert helper.join_holder() == 0
    os.close(read_end)
    os.close(write_end)


def test_a_thread_state_without_a_frame_keeps_the_drain_waiting(helper):
    assert quiesce.pending_gil_threads() == 0  # pytest's own threads all run Python
    read_end, write_end = _hold_a_thread_state(helper)
    timer = threading.Timer(0.15, os.write, (write_end, b"x"))
    start = time.monotonic()
    timer.start()
    assert quiesce.drain_gloo_workers(budget_s=10.0)
    elapsed = time.monotonic() - start
    timer.join()
    assert elapsed >= 0.15, elapsed  # not before the thread let its state go
    assert quiesce.pending_gil_threads() == 0
    assert helper.join_holder() == 0
    os.close(read_end)
    os.close(write_end)


def test_the_drain_gives_up_after_its_budget(helper, torchair_log):
    read_end, write_end = _hold_a_thread_state(helper)
    try:
        start = time.monotonic()
        assert not quiesce.drain_gloo_workers(budget_s=0.1)
        assert 0.1 <= time.monotonic() - start < 5.0
        assert any("still waiting for the GIL or running" in r.getMessage() for r in torchair_log)
    finally:
        _release(helper, read_end, write_end)


def test_a_running_native_thread_keeps_the_drain_waiting(helper):
    assert helper.start_spinner(600) == 0
    try:
        _wait_for(lambda: quiesce.runnable_native_threads() >= 1)
        start = time.monotonic()
        assert quiesce.drain_gloo_workers(budget_s=10.0)
        assert time.monotonic() - start >= 0.05  # the spinner was still running when it began
    finally:
        assert helper.join_spinner() == 0
    assert quiesce.runnable_native_threads() == 0


def test_a_quiet_process_drains_in_the_quiet_window():
    start = time.monotonic()
    assert quiesce.drain_gloo_workers(budget_s=10.0, quiet_s=0.01)
    assert time.monotonic() - start < 2.0  # no waiting beyond a few polls when nothing is busy


@pytest.fixture
def registrations(monkeypatch):
    """The drain's atexit registrations (quiesce reset to unregistered; every other
    registration is passed on)."""
    calls = []
    register = atexit.register

    def recording(fn, *args, **kwargs):
        if fn is quiesce.drain_gloo_workers:
            calls.append(fn)
            return fn
        return register(fn, *args, **kwargs)

    monkeypatch.setattr(quiesce, "_registered", False)
    monkeypatch.setattr(atexit, "register", recording)
    return calls


def test_an_emulated_gloo_group_registers_the_drain_once(registrations, tmp_path):
    with compat.emulate_npu("cpu"):
        store = dist.FileStore(str(tmp_path / "store"), 1)
        dist.init_process_group("hccl", store=store, rank=0, world_size=1)
        try:
            assert registrations == [quiesce.drain_gloo_workers]
            dist.new_group([0], backend="hccl")
            assert registrations == [quiesce.drain_gloo_workers]  # once per process
        finally:
            dist.destroy_process_group()


def test_a_compiled_collective_on_gloo_registers_the_drain(registrations, tmp_path):
    import torchair

    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)  # no emulation
    try:
        assert registrations == []
        config = torchair.CompilerConfig()
        config.debug.run_eagerly = True

        def step(x):
            dist.all_reduce(x)
            return x * 2

        compiled = torch.compile(step, backend=torchair.get_npu_backend(compiler_config=config),
                                 fullgraph=True)
        assert compiled(torch.ones(3)).tolist() == [2.0, 2.0, 2.0]
        assert registrations == [quiesce.drain_gloo_workers]
    finally:
        dist.destroy_process_group()


def test_a_graph_without_collectives_registers_nothing(registrations):
    import torchair

    compiled = torch.compile(lambda x: x + 1, backend=torchair.get_npu_backend(), fullgraph=True)
    assert compiled(torch.ones(2)).tolist() == [2.0, 2.0]
    assert registrations == []


def test_the_exit_drain_runs_after_the_script_in_a_subprocess(tmp_path):
    """A real exit: atexit runs the drain (logged at DEBUG) before Python finalizes."""
    script = tmp_path / "s.py"
    script.write_text(
        "import torch, torch.distributed as dist, torch_npu\n"
        f"store = dist.FileStore({str(tmp_path / 'store')!r}, 1)\n"
        "dist.init_process_group('hccl', store=store, rank=0, world_size=1)\n"
        "dist.all_reduce(torch.ones(2, device='npu'))\n"
        "dist.destroy_process_group()\n"
        "print('script done', flush=True)\n")
    env = dict(os.environ, TORCHAIR_LOG_LEVEL="DEBUG")
    done = subprocess.run([sys.executable, "-m", "torchair", "run", "--device", "cpu",
                           str(script)], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "script done" in done.stdout
    assert "gloo workers quiet after" in done.stderr
