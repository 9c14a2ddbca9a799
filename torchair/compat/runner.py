"""Run a script written for Ascend as ``__main__`` under the ``torch_npu`` emulation."""
from __future__ import annotations

import os
import runpy
import sys
from collections.abc import Sequence
from typing import Any

from torchair.compat.emulation import emulate_npu

__all__ = ["run_script"]


def run_script(path: str | os.PathLike, args: Sequence[str] = (), *, device: str | None = None,
               init_globals: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run ``path`` as ``__main__`` with ``sys.argv = [path, *args]`` and its folder on
    ``sys.path``, under :func:`~torchair.compat.emulate_npu` (``device``: "cpu" / "cuda").

    Returns the script's globals. ``sys.argv``, ``sys.path`` and the emulation are restored
    afterwards, also when the script raises (its exception propagates, as under ``python``).
    ``init_globals`` pre-sets names, e.g. for documentation fragments that assume a ``model``.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"torchair run: script {path!r} does not exist (or is not a "
                                "file); pass the path of a Python script")
    script_dir = os.path.dirname(os.path.abspath(path))
    old_argv, old_path = sys.argv, list(sys.path)
    sys.argv = [path, *args]
    sys.path.insert(0, script_dir)
    try:
        with emulate_npu(device):
            return runpy.run_path(path, init_globals=init_globals, run_name="__main__")
    finally:
        sys.argv = old_argv
        sys.path[:] = old_path
