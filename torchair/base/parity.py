"""TorchAir's public API and where each name stands in this torchair.

:data:`PUBLIC_API` maps every public name of Huawei TorchAir (``torchair/__init__.py``'s
``__all__`` and submodules, ``torchair.ops``, ``torchair.scope``, ``torchair.npu_fx_compiler``,
``torchair.patterns.pattern_pass_manager``, ``torchair.inference``,
``torchair.experimental.inference``, ``torchair.llm_datadist``, ``torchair.ge``) plus the
backend name ``torch.compile(backend='torchair')`` to ``(status, note)``:

- ``"works"``: same behaviour as TorchAir on CPU/CUDA (the note says where it differs in form);
- ``"no effect here"``: accepted and checked as TorchAir checks it, but what it controls exists
  only on Ascend (cores, op timeouts, GE, internal weight layouts); the note says what happens;
- ``"not supported"``: absent; accessing it raises ``AttributeError`` with the note.

:func:`resolve` returns the object behind a "works" / "no effect here" name. The table is kept
in order (top level, ops, scope, compiler, patterns, inference, experimental, unsupported).
"""
from __future__ import annotations

import importlib
from collections import OrderedDict
from typing import Any

__all__ = ["NO_EFFECT", "NOT_SUPPORTED", "PUBLIC_API", "STATUSES", "WORKS", "resolve",
           "unsupported_reason"]

WORKS = "works"
NO_EFFECT = "no effect here"
NOT_SUPPORTED = "not supported"
STATUSES = (WORKS, NO_EFFECT, NOT_SUPPORTED)

_GE = "GE (Ascend's graph engine) does not exist here; torchair lowers FX graphs itself"
_CORES = "AI Core / Vector Core counts exist only on Ascend"

PUBLIC_API: "OrderedDict[str, tuple[str, str]]" = OrderedDict([
    # ---- torchair (top level)
    ("torchair.get_npu_backend", (WORKS, "the torch.compile backend; same keyword arguments "
                                         "(compiler_config, custom_decompositions)")),
    ("torchair.get_compiler", (WORKS, "compiler(gm, example_inputs) for ATen graphs")),
    ("torchair.CompilerConfig", (WORKS, "TorchAir's option tree; options that control Ascend "
                                        "only are accepted and marked no effect")),
    ("torchair.logger", (WORKS, "logging.Logger 'torchair' (torchair.core.utils.logger)")),
    ("torchair.register_replacement", (WORKS, "FX pattern replacement, run by torchair's "
                                              "pattern fusion pass")),
    ("torchair.use_internal_format_weight", (NO_EFFECT, "walks the model and casts Linear / fp16 "
                                                        "Conv2d weights to the internal layout, "
                                                        "which is the plain (ND) layout off "
                                                        "Ascend: weights unchanged")),
    ("torchair.npu_format_cast_via_cpu", (NO_EFFECT, "returns the tensor in ND layout "
                                                     "(contiguous); Ascend's internal layouts do "
                                                     "not exist here")),
    ("torchair.patch_for_hcom", (WORKS, "warns that PyTorch >= 2.3.1 needs no patch, as "
                                        "TorchAir does, and makes dist.broadcast and "
                                        "dist.all_to_all traceable (Dynamo's remap table; "
                                        "torch.distributed itself is untouched)")),
    ("torchair.register_fx_node_ge_converter", (NO_EFFECT, "the decorator is accepted and "
                                                           "returns the converter unchanged; "
                                                           + _GE + " and runs ops through their "
                                                           "PyTorch kernels")),
    ("torchair.inference", (WORKS, "module: cache_compile, readable_cache, set_dim_gears")),
    ("torchair.ops", (WORKS, "module: the npu op library and TorchAir's graph utilities")),
    ("torchair.scope", (WORKS, "module: graph scopes")),
    ("torchair.experimental", (WORKS, "module: experimental.inference")),
    ("torchair.dynamo_export", (WORKS, "TorchAir's signature and file layout; writes an "
                                       "AOTInductor package (export_path/{export_name}.pt2, per "
                                       "rank {export_name}{rank}.pt2) and dynamo.pbtxt instead of "
                                       "an .air for ATC; torchair.load_export runs it without "
                                       "the model's code")),
    ("torchair.npu_export", (WORKS, "module: dynamo_export")),
    ("torchair.npu_export.dynamo_export", (WORKS, "same object as torchair.dynamo_export")),
    ("torch.compile(backend='torchair')", (WORKS, "a torch_dynamo_backends entry point (TorchAir "
                                                  "relies on torch_npu's backend='npu'); "
                                                  "mode= and options= set CompilerConfig")),
    # ---- torchair.ops
    ("torchair.ops.npu_fused_infer_attention_score", (WORKS, "TorchAir's form: the lengths "
                                                             "(actual_seq_lengths, _kv, "
                                                             "actual_shared_prefix_len) as int64 "
                                                             "tensors, int lists accepted; also "
                                                             "runs eagerly (TorchAir: graph mode "
                                                             "only)")),
    ("torchair.ops.npu_fused_infer_attention_score_v2", (WORKS, "mapped onto the v1 op; "
                                                                "TND/NTD layouts, rope, int8 "
                                                                "query and the *_dtype "
                                                                "arguments raise "
                                                                "NotImplementedError; also "
                                                                "runs eagerly")),
    ("torchair.ops.npu_print", (WORKS, "prints when the op runs (TorchAir prints "
                                       "asynchronously from the device); a graph that prints is "
                                       "host-scheduled")),
    ("torchair.ops.npu_create_tagged_event", (WORKS, "returns a torchair TaggedEvent (wrapping "
                                                     "a torch.cuda.Event on CUDA) instead of a "
                                                     "torch.npu.Event")),
    ("torchair.ops.npu_tagged_event_record", (WORKS, "CUDA: records on the current stream; "
                                                     "CPU: an ordering no-op on the host "
                                                     "stream")),
    ("torchair.ops.npu_tagged_event_wait", (WORKS, "CUDA: the current stream waits; CPU: an "
                                                   "ordering no-op")),
    ("torchair.ops.npu_record_tagged_stream", (WORKS, "CUDA: Tensor.record_stream on the "
                                                      "tag's stream; CPU: nothing to keep "
                                                      "alive")),
    ("torchair.ops.record", (WORKS, "an empty tensor marking a point of the current stream")),
    ("torchair.ops.wait", (WORKS, "the current stream waits for the producers of the tensors "
                                  "(CPU: an ordering no-op)")),
    ("torchair.ops.npu_wait_tensor", (WORKS, "TorchAir's older name of "
                                             "torchair.scope.npu_wait_tensor")),
    ("torchair.ops.NpuStreamSwitch", (WORKS, "TorchAir's older name of "
                                             "torchair.scope.npu_stream_switch")),
    ("torchair.ops.SuperKernelScope", (WORKS, "TorchAir's older name of "
                                              "torchair.scope.super_kernel")),
    ("torchair.ops.npu_create_tagged_external_event", (NOT_SUPPORTED, "an older TorchAir "
                                                                      "variant for events shared "
                                                                      "with captured aclgraphs; "
                                                                      "use "
                                                                      "npu_create_tagged_event")),
    ("torchair.ops.npu_tagged_event_reset", (NOT_SUPPORTED, "resets an event of "
                                                            "npu_create_tagged_external_event, "
                                                            "the older variant that is not "
                                                            "supported")),
    # ---- torchair.scope
    ("torchair.scope.npu_stream_switch", (WORKS, "CUDA streams (CPU: same results, emulated "
                                                 "schedule); enable_inner_parallel (default True, "
                                                 "as in TorchAir) is accepted and has no "
                                                 "effect")),
    ("torchair.scope.npu_wait_tensor", (WORKS, "a control edge in compiled graphs")),
    ("torchair.scope.super_kernel", (WORKS, "each segment runs as one launch unit; options "
                                            "are kept as written, parts not understood here "
                                            "are warned about at compile and ignored")),
    ("torchair.scope.limit_core_num", (NO_EFFECT, _CORES + "; checked and recorded in graph "
                                                           "dumps and the report")),
    ("torchair.scope.op_never_timeout", (NO_EFFECT, "ops have no execution timeout here; "
                                                    "checked and recorded in graph dumps and the "
                                                    "report")),
    ("torchair.scope.data_dump", (NO_EFFECT, "Ascend's device data dump (dump_config) does not "
                                             "exist here; recorded as torchair_enable_data_dump "
                                             "in graph dumps and the report (no dump_options "
                                             "json); use config.debug.data_dump")),
    ("torchair.scope.profiler_trace", (NO_EFFECT, "Ascend profiler marks; recorded in graph "
                                                  "dumps and the report; use torch.profiler")),
    ("torchair.core.utils.EVENT_LEVEL", (WORKS, "35, TorchAir's EVENT log level; "
                                                "torchair.logger.event(msg) logs at it and "
                                                "logger.warning_once(msg) warns once")),
    ("torchair.ge_concrete_graph.ge_converter.experimental.patch_for_hcom_allreduce",
     (WORKS, "importing it patches as torchair.distributed.patch_for_hcom() does (no GE "
             "converters exist here)")),
    # ---- torchair.npu_fx_compiler, torchair.patterns
    ("torchair.npu_fx_compiler.get_npu_backend", (WORKS, "same object as "
                                                         "torchair.get_npu_backend")),
    ("torchair.npu_fx_compiler.get_compiler", (WORKS, "same object as torchair.get_compiler")),
    ("torchair.patterns.pattern_pass_manager.register_replacement", (WORKS, "same object as "
                                                                           "torchair."
                                                                           "register_"
                                                                           "replacement")),
    # ---- torchair.inference, torchair.experimental.inference
    ("torchair.inference.cache_compile", (WORKS, "persists the compiled graph; warm processes "
                                                 "skip Dynamo")),
    ("torchair.inference.readable_cache", (WORKS, "prints a cache file")),
    ("torchair.inference.set_dim_gears", (WORKS, "dynamic gears")),
    ("torchair.inference.get_dim_gears", (WORKS, "public in older TorchAir")),
    ("torchair.experimental.inference.use_internal_format_weight",
     (NO_EFFECT, "see torchair.use_internal_format_weight")),
    ("torchair.experimental.inference.npu_format_cast_via_cpu",
     (NO_EFFECT, "see torchair.npu_format_cast_via_cpu")),
    # ---- not supported
    ("torchair.llm_datadist", (NOT_SUPPORTED, "Ascend's LLM-DataDist KV transfer module")),
    ("torchair.llm_datadist.create_npu_tensors", (NOT_SUPPORTED, "builds tensors over raw NPU "
                                                                 "addresses registered with "
                                                                 "LLM-DataDist")),
    ("torchair.ge", (NOT_SUPPORTED, "the GE graph-building API; " + _GE)),
    *[(f"torchair.ge.{name}", (NOT_SUPPORTED, "GE graph construction; " + _GE))
      for name in ("custom_op", "Const", "Cast", "DataType", "Format", "Tensor", "TensorSpec",
                   "attr")],
])


def unsupported_reason(name: str) -> str | None:
    """The note of ``name`` (or of its enclosing module) when it is "not supported"."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        status, note = PUBLIC_API.get(".".join(parts[:end]), (None, None))
        if status == NOT_SUPPORTED:
            return note
    return None


def resolve(name: str) -> Any:
    """The object behind ``name`` (a "works" or "no effect here" entry of :data:`PUBLIC_API`).

    Dotted names are imported module by module and then read attribute by attribute;
    ``torch.compile(backend='torchair')`` resolves to the backend Dynamo looks up by that name.
    """
    if name not in PUBLIC_API:
        raise KeyError(f"{name!r} is not in torchair.base.parity.PUBLIC_API")
    status, note = PUBLIC_API[name]
    if status == NOT_SUPPORTED:
        raise LookupError(f"{name} is not supported: {note}")
    if name.startswith("torch.compile("):
        from torch._dynamo import lookup_backend

        return lookup_backend(name.split("'")[1])
    parts = name.split(".")
    obj: Any = importlib.import_module(parts[0])
    for i, part in enumerate(parts[1:], start=1):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            obj = importlib.import_module(".".join(parts[:i + 1]))
    return obj
