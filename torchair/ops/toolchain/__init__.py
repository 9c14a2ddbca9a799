"""Kernel build machinery shared by the op families.

* ``native.py``: builds the C/C++ sources of ``csrc/`` on first use with the host compiler, into
  a safe on-disk cache, and loads them (ctypes, or PyTorch's dispatcher for C++ operators).
* ``csrc/``: ``decode_attention.c`` (native CPU decode attention), ``launch_ops.cpp`` (C++
  dispatcher kernels that static units call).
* ``triton_utils.py``: helpers of every Triton kernel module (``HAS_TRITON``, launch checks).
* ``triton_aot.py``: compiles every Triton kernel for an NVIDIA GPU without one
  (``python -m torchair.ops.toolchain.triton_aot``).
"""
