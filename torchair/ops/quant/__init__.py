"""Quantization ops: ``npu_dynamic_quant``, ``npu_add_rms_norm_dynamic_quant``,
``npu_quant_matmul`` and ``npu_dequant_swiglu_quant``.

* Op definitions and references: ``dynamic_quant.py``, ``quant_matmul.py``,
  ``dequant_swiglu_quant.py`` (the kernels of dynamic quant live with the norm ones, in
  ``norm/cpu.py`` and ``norm/triton.py``).
* ``plans.py``: the canonical plans the op modules build and every kernel consumes.
* Kernels per backend: ``cpu.py``, ``triton.py``; they import ``plans.py``, never an op module.
"""
