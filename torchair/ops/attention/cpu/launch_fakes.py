"""The launch kernels as Python sees them: the operator handles and their fake kernels.

``torchair_native::ifa_decode`` and ``torchair_native::fia_prompt`` are registered by the C++
library (:mod:`torchair.ops.attention.cpu.launch_library`); tracing a graph that calls them
(Inductor, AOTInductor, the compile cache) needs a fake kernel for each, registered here when the
library loads. A call in a static unit's graph carries, as its last argument, a number naming the
operator's schema (:func:`abi`), so that a library built against another schema is refused.
"""
from __future__ import annotations

from typing import Any

import torch

from torchair.ops.toolchain import native as _native

__all__ = ["abi", "fia_prompt", "ifa_decode", "register"]


def ifa_decode() -> Any:
    """The operator (``launch_library.available()`` must be True)."""
    return torch.ops.torchair_native.ifa_decode.default


def fia_prompt() -> Any:
    """``torchair_native::fia_prompt`` (``launch_library.available()`` must be True): an
    ``npu_fused_infer_attention_score`` call with any number of query tokens, as
    :class:`torchair.runtime.binders.attention.AttentionBinder` binds it (launch_ops.cpp: each
    query token a row of the decode kernel with its own window of KV positions)."""
    return torch.ops.torchair_native.fia_prompt.default


def abi(op: Any) -> int:
    """The number naming ``op``'s schema that a unit passes as its ``abi`` argument
    (:func:`torchair.ops.toolchain.native.abi_number`)."""
    return _native.abi_number(op)


def register() -> torch.library.Library:
    """Register both operators' fake kernels (once, when the library has registered them);
    the returned fragment must be kept alive."""
    lib = torch.library.Library("torchair_native", "FRAGMENT")
    torch.library.register_fake("torchair_native::ifa_decode", _ifa_decode_fake, lib=lib)
    torch.library.register_fake("torchair_native::fia_prompt", _fia_prompt_fake, lib=lib)
    return lib


def _ifa_decode_fake(query, key, value, actual_seq_lengths, ends, block_table, num_heads,
                     num_key_value_heads, layout, block_size, scale_value, defer_errors=False,
                     host_lengths=False, abi=0):
    return query.new_empty(query.shape)  # contiguous, as the kernel's (and its fallback's) result


def _fia_prompt_fake(query, key, value, actual_seq_lengths, actual_seq_lengths_kv, block_table,
                     num_heads, num_key_value_heads, layout, block_size, scale, sparse_mode,
                     pre_tokens, next_tokens, host_lengths=0, wording=0, defer_errors=False,
                     atten_mask=None, abi=0):
    return query.new_empty(query.shape)  # contiguous, as the kernel's result
