"""Matrix products of static units.

* ``cpu.py``: ``torchair_native::gemv``, the C++ dispatcher kernel that CPU static units call for
  their few-row products (a decode step's linear layers: ``mm(x, W.t())`` with ``x`` a handful of
  rows) and its float64 reference. Its binder, which rewrites a unit's graph to call it, is
  :class:`torchair.runtime.binders.small_products.SmallProductBinder`. The kernel is
  ``toolchain/csrc/small_gemm.cpp``.
"""
