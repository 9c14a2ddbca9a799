"""Whether a launch-kernel library's errors reach Python here: checked once, in a child process.

On one lent GPU host (Ubuntu, Python 3.12, torch 2.11, that host's compiler) every ValueError
raised by the launch kernels' C++ library killed the process with SIGSEGV, while the same code
passes on this project's machines. So before a library build is first used on a machine, a child
process loads it and makes it raise (:mod:`torchair.ops.attention.cpu.launch_probe_child`); a
library that fails the check is not used, and the verdict is kept beside it in the kernel cache.
This module is the parent's side: it runs the child and keeps the verdict.
"""
from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys

from torchair.base.log import logger
from torchair.ops.toolchain import native as _native

__all__ = ["PROBE_ENV", "PROBE_FAILED", "PROBE_OTHER_LIBRARY", "PROBE_TIMEOUT_S",
           "errors_reach_python"]

PROBE_ENV = "TORCHAIR_LAUNCH_PROBE"  # in the checking child: the library it must load
PROBE_TIMEOUT_S = 180.0
PROBE_FAILED = 3  # the child's exit status when an error path misbehaved without crashing
PROBE_OTHER_LIBRARY = 4  # ... when it loaded another library than the one to check
# the directory holding this torchair package (torchair/ops/attention/cpu/launch_probe.py)
_ROOT = pathlib.Path(os.path.abspath(__file__)).parents[4]
_PROBE_CODE = ("from torchair.ops.attention.cpu import launch_probe_child; "
               "launch_probe_child.main()")
# what a broken error path does to the child; anything else (a timeout, SIGKILL from an OOM
# killer, Ctrl-C, a child that cannot import torchair) says nothing about the library
_CRASH_SIGNALS = {signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS, signal.SIGILL, signal.SIGFPE}


def errors_reach_python(library: str) -> bool:
    """Whether the library's error path works here: a bad length raises ``ValueError`` in a
    child process (an exception thrown by the library through PyTorch's dispatcher) and a
    deferred one is kept. Checked once per library build, one process at a time; the verdict
    ("ok", or how the child failed) is kept in ``<library>.errors`` beside it. A check that says
    nothing about the library (a timeout, a child that could not start) keeps no verdict: this
    process does without the library and the next one checks again."""
    if os.environ.get(PROBE_ENV):
        return True
    path = pathlib.Path(library + ".errors")
    try:
        with _native.locked(path.with_name(path.name + ".lock")):
            raw = _native.read_private(path)
            verdict = raw.decode(errors="replace").strip() if raw else ""
            kept = bool(verdict)
            if not kept:
                verdict, kept = _run_probe(library)
                if kept:
                    _write_verdict(path, verdict)
    except (OSError, RuntimeError) as exc:  # an unsafe or unreadable file, no lock
        verdict, kept = f"its verdict file cannot be used ({exc})", False
    if verdict == "ok":
        return True
    hint = (f"delete {path} to check again" if kept else "the next process checks again")
    logger.warning("launch kernels: the C++ library %s cannot be shown to raise its errors in "
                   "this process (checked in a child process: %s); eager calls and static units "
                   "use the general ops, which are slower (%s, or set %s=0 to turn native "
                   "kernels off)", library, verdict, hint, _native.ENV_DISABLE)
    return False


def _run_probe(library: str) -> tuple[str, bool]:
    """(verdict, whether it is about the library): ``("ok", True)`` when the child passed."""
    root = str(_ROOT)
    env = dict(os.environ, **{PROBE_ENV: library})
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    try:
        child = subprocess.Popen([sys.executable, "-c", _PROBE_CODE], env=env, text=True,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 start_new_session=True)  # its own group: killed as a whole
    except OSError as exc:
        return f"the child did not start ({exc})", False
    try:
        out, err = child.communicate(timeout=PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(child.pid, signal.SIGKILL)
        except OSError:
            pass
        child.communicate()
        return f"no answer in {PROBE_TIMEOUT_S:.0f} s", False
    rc = child.returncode
    if rc == 0 and out.strip().endswith("ok"):
        return "ok", True
    if rc < 0:
        try:
            sig = signal.Signals(-rc)
        except ValueError:
            return f"the child was killed by signal {-rc}", False
        return f"the child was killed by {sig.name}", sig in _CRASH_SIGNALS
    tail = " | ".join((err or out).strip().splitlines()[-3:])[-400:]
    return f"the child exited with {rc}: {tail}", rc == PROBE_FAILED


def _write_verdict(path: pathlib.Path, verdict: str) -> None:
    try:
        _native.write_private(path, (verdict + "\n").encode())
    except OSError as exc:  # a read-only cache: the check runs again in the next process
        logger.warning("launch kernels: could not keep the error check's verdict in %s (%s); "
                       "each process checks again", path, exc)
