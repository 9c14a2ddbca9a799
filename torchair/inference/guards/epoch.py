"""A process-wide counter of ``nn.Module`` registrations: the module epoch.

Every parameter, buffer or submodule assigned to any ``nn.Module`` (PyTorch's global registration
hooks, installed by :func:`watch_modules`) bumps :func:`module_epoch`. A cached frame's per-call
check skips the guards on module attributes and globals while the epoch is the one of its last
full check, and runs them all again on the next call after any such assignment.
"""
from __future__ import annotations

from typing import Any

import torch
from torch.nn.modules import module as nn_module

__all__ = ["EPOCH", "module_epoch", "watch_modules"]

_module_epoch = [0]
EPOCH = _module_epoch  # the counter itself (EPOCH[0]), for a per-call check that reads it inline
_epoch_hooks: list = []


def _bump_epoch(*_: Any) -> None:
    # Dynamo traces these hooks where a compiled forward assigns a buffer (transformers' caches
    # do): bumping there made every such frame guard on the epoch's value and compile again at
    # each call, up to Dynamo's recompile limit. Dynamo replays the assignment after its graph
    # without the hooks, so an assignment inside a compiled region does not bump the epoch;
    # cache_compile's per-call check still reads each call's parameters and buffers.
    if torch.compiler.is_compiling():
        return
    _module_epoch[0] += 1


def watch_modules() -> None:
    """Install the registration hooks that bump the epoch (once per process)."""
    if _epoch_hooks:
        return
    _epoch_hooks.extend([nn_module.register_module_parameter_registration_hook(_bump_epoch),
                         nn_module.register_module_buffer_registration_hook(_bump_epoch),
                         nn_module.register_module_module_registration_hook(_bump_epoch)])


def module_epoch() -> int:
    """How many module registrations happened since :func:`watch_modules` (outside compiled
    code)."""
    return _module_epoch[0]
