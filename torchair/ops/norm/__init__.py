"""RMS-norm ops: ``npu_rms_norm``, ``npu_add_rms_norm``, ``npu_add_rms_norm_cast``.

* ``rms_norm.py``: op definitions and references.
* Kernels per backend: ``cpu.py``, ``triton.py`` (these also hold the kernels of the dynamic
  quant ops of ``quant/dynamic_quant.py``, which fuse an RMS norm).
"""
