"""Attention ops: ``npu_incre_flash_attention`` (IFA), ``npu_fused_infer_attention_score`` (FIA),
its ``_v2`` and ``npu_prompt_flash_attention`` (PFA, FIA's prompt case).

* Op definitions and their plain-PyTorch references: ``incre_flash_attention.py``,
  ``fused_infer_attention_score.py``, ``fused_infer_attention_score_v2.py``,
  ``prompt_flash_attention.py``.
* Shared by them: ``ifa_checks.py`` / ``fia_checks.py`` (argument validation into plans),
  ``common.py`` (layouts, masks, softmax core), ``ifa_compute.py`` (device-side pieces),
  ``ifa_fast.py`` (the eager CPU fast path of IFA) and ``decode.py`` (the canonical decode
  attention contract, its reference and the per-device kernel registry).
* Kernels per backend: ``cpu/`` and ``triton/`` (CUDA).

What runs when a CPU static unit calls attention: the unit's binder
(:class:`torchair.runtime.binders.attention.AttentionBinder`) binds the call to the C++
dispatcher kernel ``torchair_native::ifa_decode`` (``toolchain/csrc/launch_ops.cpp``, built by
``toolchain/native.py``), which calls the native decode kernel
``toolchain/csrc/decode_attention.c``.
"""
