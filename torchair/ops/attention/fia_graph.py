"""TorchAir's graph-mode ``torchair.ops.npu_fused_infer_attention_score``: lengths as tensors.

TorchAir's ``torchair.ops.npu_fused_infer_attention_score`` is not torch_npu's op: it takes
``actual_seq_lengths``, ``actual_seq_lengths_kv`` and ``actual_shared_prefix_len`` as int64
device tensors (``Tensor?``), so that a graph reads them on the device and never turns them into
host scalars; every other argument is torch_npu's. Here it is a plain Python function, which
Dynamo inlines (no graph break), over the two ops of the library:

* tensor (or absent) lengths: the tensor twin ``npu::npu_fused_infer_attention_score_tensor``.
  The lengths stay tensors in the graph: changing their values recompiles nothing, and with
  ``tiling_schedule_optimize`` (path 4) the graph builds as one static unit;
* int lists only: torch_npu's ``npu::npu_fused_infer_attention_score`` (``SymInt[]`` lengths,
  value-dependent: path 4 sinks them into the unit's buffer), for scripts that pass lists;
* a mix: the lists become int64 tensors on the query's device and the twin runs.

Deliberate difference: TorchAir raises ``NotImplementedError`` when it is called eagerly (it is
for graph mode only); this one runs eagerly too, with the op's own kernel.
``torch_npu.npu_fused_infer_attention_score`` (the emulated torch_npu) stays the int-list op.
"""
from __future__ import annotations

import torch

__all__ = ["npu_fused_infer_attention_score"]

_LENGTHS = ("actual_seq_lengths", "actual_seq_lengths_kv", "actual_shared_prefix_len")


def npu_fused_infer_attention_score(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                    *, actual_seq_lengths=None, actual_seq_lengths_kv=None,
                                    actual_shared_prefix_len=None, **kwargs):
    """TorchAir's FIA with ``actual_seq_lengths``, ``actual_seq_lengths_kv`` and
    ``actual_shared_prefix_len`` as 1-D int64 tensors on the query's device (int lists are
    accepted too); the other keyword arguments and the result ``(attention_out, softmax_lse)``
    are those of ``torch_npu.npu_fused_infer_attention_score`` (module doc)."""
    lengths = {"actual_seq_lengths": actual_seq_lengths,
               "actual_seq_lengths_kv": actual_seq_lengths_kv,
               "actual_shared_prefix_len": actual_shared_prefix_len}
    given = [v for v in lengths.values() if v is not None]
    if given and not any(isinstance(v, torch.Tensor) for v in given):
        return torch.ops.npu.npu_fused_infer_attention_score(query, key, value, **lengths,
                                                             **kwargs)
    for name in _LENGTHS:
        v = lengths[name]
        if v is not None and not isinstance(v, torch.Tensor):
            lengths[name] = torch.tensor(v, dtype=torch.int64, device=query.device)
    return torch.ops.npu.npu_fused_infer_attention_score_tensor(query, key, value, **lengths,
                                                                **kwargs)
