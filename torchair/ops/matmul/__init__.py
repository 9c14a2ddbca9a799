"""Matrix products of static units.

* ``cpu.py``: ``torchair_native::gemv``, the C++ dispatcher kernel that CPU static units call for
  their few-row products (a decode step's linear layers: ``mm(x, W.t())`` with ``x`` a handful of
  rows), its binder (:func:`torchair.ops.matmul.cpu.bind_static_unit`) and its float64
  reference. The kernel is ``toolchain/csrc/small_gemm.cpp``.
"""
