"""The child's side of the launch kernels' error check (see ``launch_probe.py``).

Run as ``python -c "...; launch_probe_child.main()"`` with ``TORCHAIR_LAUNCH_PROBE`` naming the
library to check: loads that very library, makes it raise a ValueError through PyTorch's
dispatcher and defer another, and prints "ok" when both error paths work. A separate module from
the parent's side because it needs the loaded library, whose loader needs the parent's side.
"""
from __future__ import annotations

import os
import sys

import torch

from torchair.ops.attention.cpu import launch_library as _library
from torchair.ops.attention.cpu.launch_fakes import ifa_decode
from torchair.ops.attention.cpu.launch_probe import PROBE_ENV, PROBE_FAILED, PROBE_OTHER_LIBRARY

__all__ = ["main"]


def main() -> None:
    """Print "ok" when both error paths work; exit with ``PROBE_FAILED`` when one misbehaves
    (or die, when one crashes)."""
    if not _library.load():
        raise SystemExit("the launch kernels did not load in the child")
    loaded = _library.library_path()
    if os.path.abspath(loaded) != os.path.abspath(os.environ[PROBE_ENV]):
        print(f"the child loaded {loaded}, not {os.environ[PROBE_ENV]}", file=sys.stderr)
        raise SystemExit(PROBE_OTHER_LIBRARY)
    q, kv = torch.zeros(1, 8, 1, 64), torch.zeros(1, 2, 16, 64)

    def call(defer: bool) -> torch.Tensor:
        return ifa_decode()(q, kv, kv, torch.tensor([-1]), None, None, 8, 2,
                            _library.LAYOUTS["BNSD"], 0, 0.125, defer)

    def failed(why: str) -> None:
        print(why, file=sys.stderr)
        raise SystemExit(PROBE_FAILED)

    try:
        call(False)
    except ValueError as exc:
        if "actual_seq_lengths" not in str(exc):
            failed(f"unexpected error text: {exc}")
    except Exception as exc:  # noqa: BLE001 - the wrong type is the finding
        failed(f"a negative length raised {type(exc).__name__}, not ValueError: {exc}")
    else:
        failed("a negative length raised nothing")
    call(True)
    if _library.take() is None:
        failed("a deferred error was not kept")
    print("ok")
