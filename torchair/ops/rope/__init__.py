"""Rotary-embedding ops: ``npu_apply_rotary_pos_emb`` (in place on query and key),
``npu_rotary_mul`` (functional) and DeepSeek MLA's ``npu_kv_rmsnorm_rope_cache`` and
``npu_interleave_rope``.

* ``common.py``: the rotation modes (half / quarter / interleave), argument checks and the fp32
  reference rotation shared by the ops.
* ``rotary.py``: ``npu_apply_rotary_pos_emb`` (+ its functional twin, what a compiled graph runs)
  and ``npu_rotary_mul``: schemas, fake kernels, references, eager dispatch.
* ``kv_rmsnorm_rope_cache.py``: ``npu_kv_rmsnorm_rope_cache`` (+ functional twin).
* ``interleave_rope.py``: ``npu_interleave_rope`` (MLA's rope on one tensor; its formula,
  ``common.interleaved_rope_reference``, is the rope part of the cache op too).
* ``_inplace.py``: the functionalization kernel shared by the in-place ops.
* Kernels per backend: ``cpu.py``, ``triton.py``.
"""
