"""Activation ops: ``npu_swiglu``.

* ``swiglu.py``: op definition, reference, eager dispatch.
* Kernels per backend: ``cpu.py``, ``triton.py``.
"""
