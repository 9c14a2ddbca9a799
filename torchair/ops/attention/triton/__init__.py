"""Triton (CUDA) kernels of the attention ops.

* ``decode.py``: the ``"cuda"`` decode attention kernel (registered with ``attention/decode.py``
  when Triton is importable).
"""
