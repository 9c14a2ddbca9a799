"""CPU kernels of the attention ops.

* ``decode.py``: the ``"cpu"`` decode attention kernel (registered with ``attention/decode.py``):
  the native C kernel when it takes the arguments, else a chunked BLAS path.
* ``native.py``: argument checks and the ctypes call of the native C kernel
  (``toolchain/csrc/decode_attention.c``).
* The launch kernels: C++ dispatcher kernels that CPU static units (and the eager fast path)
  call without Python (``toolchain/csrc/launch_ops.cpp``). ``launch_library.py`` loads and
  registers the library; ``launch_probe.py`` (with ``launch_probe_child.py``) checks once, in a
  child process, that its errors reach Python; ``launch_fakes.py`` holds the operators' handles
  and fake kernels; ``launch_errors.py`` raises the errors a unit's calls deferred as eager
  words them. Which calls of a unit's graph use them is
  :class:`torchair.runtime.binders.attention.AttentionBinder`'s choice.
"""
