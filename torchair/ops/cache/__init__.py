"""Cache-write ops: ``scatter_update`` / ``scatter_update_`` (KV-cache slots at per-batch
positions) and ``npu_scatter_nd_update`` / ``npu_scatter_nd_update_`` (TensorFlow's scatter_nd
update).

* Op definitions and their plain-PyTorch references: ``scatter_update.py``,
  ``scatter_nd_update.py``.
* ``checks.py``: the dtype checks both ops share.
* ``_inplace.py``: the in-place / functional pair and its functionalization (a compiled graph
  that writes a KV cache input keeps writing it in place).
* ``cpu.py``: the eager kernels (one ``index_put_``; CPU and CUDA).
"""
