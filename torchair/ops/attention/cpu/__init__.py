"""CPU kernels of the attention ops.

* ``decode.py``: the ``"cpu"`` decode attention kernel (registered with ``attention/decode.py``):
  the native C kernel when it takes the arguments, else a chunked BLAS path.
* ``native.py``: argument checks and the ctypes call of the native C kernel
  (``toolchain/csrc/decode_attention.c``).
* ``launch.py``: the C++ dispatcher kernels that CPU static units (and the eager fast path) call
  without Python (``toolchain/csrc/launch_ops.cpp``).
"""
