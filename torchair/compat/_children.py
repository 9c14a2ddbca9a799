"""The emulation in the threads and child processes a script starts.

- Threads: a ``TorchFunctionMode`` is thread-local, so the emulation wraps
  ``threading.Thread._bootstrap_inner`` (every ``threading.Thread``, ``ThreadPoolExecutor``
  workers included, starts there): a thread started while emulated runs with the device mode
  on its own mode stack. The other patches (``torch.npu``, ``Tensor.npu``, ``torch.device``
  ...) are process-wide already.
- Child processes (``torch.multiprocessing.spawn``, ``multiprocessing`` with the spawn or
  forkserver start method, ``subprocess`` running Python): the folder of a ``torch_npu`` shim
  package (``_child/torch_npu``) goes on ``sys.path`` right after the script's folder (spawn
  children copy the parent's) and first on ``$PYTHONPATH``, and ``$TORCHAIR_NPU_EMULATION`` names the device. The child's
  ``import torch_npu`` (a script re-imported as ``__mp_main__`` imports it at its top) installs
  the emulation on that device. Forked children inherit everything.

The shim's import calls :func:`torchair.compat.emulation.install_in_child`.
``restore()`` undoes all of it (the wrapper, ``sys.path``, both variables).
"""
from __future__ import annotations

import os
import sys
import threading
from typing import Any, Callable

from torch.overrides import TorchFunctionMode

from torchair.compat._mode import pop_mode

__all__ = ["DEVICE_ENV", "SHIM_DIR", "child_env_patches", "is_shim", "thread_bootstrap"]

DEVICE_ENV = "TORCHAIR_NPU_EMULATION"
SHIM_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_child")


def thread_bootstrap(mode: TorchFunctionMode) -> Callable[[threading.Thread], None]:
    """A ``Thread._bootstrap_inner`` that runs the thread with ``mode`` on its mode stack."""
    original = threading.Thread._bootstrap_inner

    def _bootstrap_inner(self: threading.Thread) -> None:
        mode.__enter__()
        try:
            original(self)
        finally:
            pop_mode(mode)

    return _bootstrap_inner


def is_shim(spec_or_module: Any) -> bool:
    """Whether a ``torch_npu`` module or its spec is the shim in :data:`SHIM_DIR`."""
    if getattr(spec_or_module, "__torchair_shim__", False):
        return True
    origin = getattr(spec_or_module, "origin", None)
    return isinstance(origin, str) and os.path.abspath(origin).startswith(SHIM_DIR + os.sep)


def child_env_patches(target: str) -> list[Callable[[], None]]:
    """Put the shim's folder on ``sys.path`` (second) and ``$PYTHONPATH`` (first) and set
    ``$TORCHAIR_NPU_EMULATION=target``; returns the undo functions."""
    undo: list[Callable[[], None]] = []
    python_path = os.environ.get("PYTHONPATH", "")
    if SHIM_DIR not in python_path.split(os.pathsep):  # a child's own emulation: already there
        python_path = os.pathsep.join(p for p in (SHIM_DIR, python_path) if p)
    for name, value in (("PYTHONPATH", python_path), (DEVICE_ENV, target)):
        old = os.environ.get(name)
        if old == value:
            continue
        os.environ[name] = value

        def put_back(name: str = name, old: str | None = old, value: str = value) -> None:
            if os.environ.get(name) != value:
                return  # changed by the script since: leave its value
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old
        undo.append(put_back)
    if SHIM_DIR not in sys.path:
        sys.path.insert(1 if sys.path else 0, SHIM_DIR)  # sys.path[0] stays the script's folder

        def drop_path() -> None:
            if SHIM_DIR in sys.path:
                sys.path.remove(SHIM_DIR)
        undo.append(drop_path)
    return undo

