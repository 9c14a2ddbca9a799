"""The user-facing configuration of the TorchAir backend.

Usage::

    from torchair.configs.compiler_config import CompilerConfig

    config = CompilerConfig()
    config.mode = "reduce-overhead"
    config.debug.graph_dump.type = "py"
    config.experimental_config.frozen_parameter = True

Every assignment is validated immediately; see :meth:`CompilerConfig.describe`
for the table of options.
"""

from __future__ import annotations

from ._option import BOOL, PATH, ConfigNode, Option, SubConfig

__all__ = [
    "CompilerConfig",
    "DebugConfig",
    "GraphDumpConfig",
    "ExperimentalConfig",
    "InferenceConfig",
]


class GraphDumpConfig(ConfigNode):
    """``debug.graph_dump``: dumping the IR graph for inspection."""

    type = Option(
        None,
        allowed=(None, "txt", "pbtxt", "py"),
        doc="Format of the IR graph dumps (as converted and after optimization); None disables dumping.",
    )
    path = Option(
        None,
        kind=PATH,
        doc="Directory the IR graph dumps are written to; None means the current working directory.",
    )


class DebugConfig(ConfigNode):
    """``debug``: debugging aids."""

    graph_dump = SubConfig(GraphDumpConfig, doc="Dumping of the IR graph.")
    run_eagerly = Option(
        False,
        kind=BOOL,
        doc="Execute the optimized FX graph op by op with the FX engine, skipping code generation (debugging, fast tests).",
    )


class ExperimentalConfig(ConfigNode):
    """``experimental_config``: features that may change or go away."""

    tiling_schedule_optimize = Option(
        False,
        kind=BOOL,
        doc="Tiling sink: value-dependent ops (e.g. flash attention's actual_seq_lengths) read those values on the device, so the graph stays static and runs as one launch unit.",
    )
    pattern_fusion_pass = Option(
        True,
        kind=BOOL,
        doc="Apply the FX pattern fusion passes to the graph.",
    )
    frozen_parameter = Option(
        False,
        kind=BOOL,
        doc="TorchAir compatibility: parameters are frozen (same address and value on every call). Changes nothing yet: static launch units already use parameters in place.",
    )


class InferenceConfig(ConfigNode):
    """``inference_config``: options for inference graphs."""

    dynamic_gears_merge_policy = Option(
        "zip",
        allowed=("zip", "product"),
        doc="How the gears of several inputs combine: 'zip' pairs the i-th gears, 'product' takes every combination.",
    )


class CompilerConfig(ConfigNode):
    """Root of the TorchAir compiler configuration.

    Helpers (inherited from :class:`ConfigNode`): ``as_dict()``,
    ``options()``, ``compute_hash()``, ``copy()``, ``describe()``; ``==``
    compares the flat options and ``repr`` lists the non-default ones.
    """

    mode = Option(
        "max-autotune",
        allowed=("max-autotune", "reduce-overhead"),
        doc="'max-autotune': compile static graphs with Inductor-generated kernels launched as one unit; 'reduce-overhead': no codegen, run the FX graph's ATen ops and cut launch overhead with CUDA graphs on CUDA.",
    )
    debug = SubConfig(DebugConfig, doc="Debugging aids.")
    experimental_config = SubConfig(ExperimentalConfig, doc="Experimental features.")
    inference_config = SubConfig(InferenceConfig, doc="Inference options.")
