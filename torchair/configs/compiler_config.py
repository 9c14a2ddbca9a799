"""The user-facing configuration of the TorchAir backend: TorchAir's option tree.

Usage::

    from torchair.configs.compiler_config import CompilerConfig

    config = CompilerConfig()
    config.mode = "reduce-overhead"
    config.debug.graph_dump.type = "py"
    config.experimental_config.frozen_parameter = True
    config.mode.value                      # "reduce-overhead" (TorchAir's OptionValue read-back)

Every option TorchAir has exists here with its values and validation (error types and texts
start as TorchAir's). Each option says what it does here: ``works``, ``no effect here``
(Ascend-only: GE, AOE, device dumps; accepted and logged once at INFO) or ``not supported``
(meaningful off Ascend, not implemented; logged once as a WARNING). See
:meth:`CompilerConfig.describe` for the table.
"""

from __future__ import annotations

from ._option import (
    ANY,
    BOOL,
    CALLABLE,
    DIR,
    FILE,
    INT_LIST,
    JSON_FILE,
    NO_EFFECT,
    NOT_SUPPORTED,
    OUT_DIR,
    STR,
    ConfigNode,
    IntRange,
    Option,
    Regex,
    SubConfig,
)

__all__ = [
    "CompilerConfig",
    "DebugConfig",
    "GraphDumpConfig",
    "ExperimentalConfig",
    "InferenceConfig",
]

_GE = "a Graph Engine (GE) option of Ascend's graph compiler; graphs here are compiled by Inductor or run by the FX engine"
_ACLNN = "Ascend aclnn static kernels; CUDA graphs here replay Inductor/ATen kernels"


def _ge(default, doc, **kw):
    return Option(default, doc=doc, effect=NO_EFFECT, why=_GE, **kw)


class GraphDumpConfig(ConfigNode):
    """``debug.graph_dump``: dumping the IR graph for inspection."""

    peer_name = "_Dump"
    type = Option(
        None,
        allowed=(None, "txt", "pbtxt", "py"),
        doc="Format of the IR graph dumps (as converted and after optimization); None disables dumping.",
    )
    path = Option(
        None,
        kind=OUT_DIR,
        doc="Directory the IR graph dumps are written to; None means the current working directory.",
    )


class DataDumpConfig(ConfigNode):
    """``debug.data_dump``: run op by op and save every op's inputs and outputs as ``.npy``."""

    peer_name = "_DataDump"
    type = Option(
        None,
        allowed=(None, "npy"),
        doc="'npy': run the graph op by op (FX interpreter, no codegen) and save each op's inputs and outputs per step.",
    )
    filter = Option(
        None,
        kind=ANY,
        doc="Callable(node) -> node or None: which FX nodes to dump (None skips the node); None dumps all.",
    )
    path = Option(
        None,
        kind=OUT_DIR,
        doc="Root directory of the data dumps; None means the current working directory.",
    )


class FxSummaryConfig(ConfigNode):
    """``debug.fx_summary``: a CSV summary of the ops of each graph."""

    peer_name = "_FxSummary"
    type = Option(
        None,
        allowed=(None, "csv"),
        doc="'csv': write one CSV per graph listing each op target, its count and whether torchair has a kernel for it.",
    )
    skip_compile = Option(
        True,
        kind=BOOL,
        doc="After the summary, run the graph eagerly (op by op) instead of compiling it.",
    )
    path = Option(
        None,
        kind=OUT_DIR,
        doc="Directory of the summaries; None means the current working directory.",
    )


class AclGraphDebugConfig(ConfigNode):
    """``debug.aclgraph``: debug switches of the graph-capture mode (``reduce-overhead``)."""

    peer_name = "_AclGraphDebugConfig"
    disable_reinplace_inplaceable_ops_pass = Option(
        False, kind=BOOL, effect=NOT_SUPPORTED,
        why="torchair's reinplace pass (reinplace_inputs) always runs: it keeps KV-cache writes in place",
        doc="Skip re-inplacing of functionalized in-place ops.")
    disable_reinplace_input_mutated_ops_pass = Option(
        False, kind=BOOL, effect=NOT_SUPPORTED,
        why="torchair's reinplace pass (reinplace_inputs) always runs: it keeps KV-cache writes in place",
        doc="Skip re-inplacing of ops that mutate graph inputs.")
    disable_mempool_reuse_in_same_fx = Option(
        False, kind=BOOL, effect=NOT_SUPPORTED,
        why="CUDA graphs of one FX graph share torch's graph pool as torch.cuda.graphs does",
        doc="Give each captured graph of one FX graph its own memory pool.")
    enable_output_clone = Option(
        False, kind=BOOL, effect=NOT_SUPPORTED,
        why="outputs of a replayed CUDA graph are always returned as fresh tensors here",
        doc="Clone the outputs of a replayed captured graph.")
    static_capture_size_limit = Option(
        64, kind=IntRange(1), effect=NOT_SUPPORTED,
        why="torchair captures one CUDA graph per gear / static shape; the limit is Dynamo's recompile limit",
        doc="Most graphs captured per FX graph.")
    clone_input = Option(
        True, kind=BOOL, effect=NOT_SUPPORTED,
        why="inputs are always copied into the captured graph's static buffers here",
        doc="Copy inputs into the captured graph's static input buffers.")


class DebugConfig(ConfigNode):
    """``debug``: debugging aids."""

    peer_name = "_DebugConfig"
    graph_dump = SubConfig(GraphDumpConfig, doc="Dumping of the IR graph.")
    data_dump = SubConfig(DataDumpConfig, doc="Per-op data dumps (.npy).")
    fx_summary = SubConfig(FxSummaryConfig, doc="Per-graph op summaries (CSV).")
    run_eagerly = Option(
        False,
        kind=BOOL,
        doc="Execute the optimized FX graph op by op with the FX engine, skipping code generation (debugging, fast tests).",
    )
    aclgraph = SubConfig(AclGraphDebugConfig, doc="Debug switches of graph capture.")


class AclGraphExperimentalConfig(ConfigNode):
    """``experimental_config.aclgraph``: Ascend static-shape kernel compilation."""

    peer_name = "_AclGraphExperimentalConfig"
    _aclnn_static_shape_kernel = Option(False, kind=BOOL, effect=NO_EFFECT, why=_ACLNN,
                                        doc="Compile static-shape aclnn kernels for captured graphs.")
    _aclnn_static_shape_kernel_build_dir = Option(None, kind=STR, effect=NO_EFFECT, why=_ACLNN,
                                                  doc="Build directory of the static kernels.")
    _aclnn_static_shape_kernel_sym_value_range = Option(
        None, kind=INT_LIST, effect=NO_EFFECT, why=_ACLNN,
        doc="Symbol values that trigger a static-kernel compile.")
    _aclnn_static_shape_kernel_sym_index = Option(0, kind=IntRange(0), effect=NO_EFFECT,
                                                  why=_ACLNN, doc="Which symbol is checked.")


class ExperimentalConfig(ConfigNode):
    """``experimental_config``: features that may change or go away."""

    peer_name = "_ExperimentalConfig"
    cc_parallel_enable = _ge(False, "Run computation and communication in parallel.", kind=BOOL)
    keep_inference_input_mutations = Option(
        True, kind=BOOL,
        doc="Keep input mutations (KV-cache writes) in the inference graph (AOTAutograd's keep_inference_input_mutations); False copies them back after the graph.")
    memory_efficiency = _ge(False, "GE feature-map refreshable memory.", kind=BOOL)
    frozen_parameter = Option(
        False,
        kind=BOOL,
        doc="TorchAir compatibility: parameters are frozen (same address and value on every call). Static launch units already use parameters in place.",
    )
    static_model_ops_lower_limit = _ge(None, "GE static-subgraph op threshold.",
                                       kind=IntRange(-1, none_ok=True))
    jit_compile = _ge("auto", "GE kernel jit compile mode.", allowed=("auto",))
    npu_fx_pass = Option(
        False, kind=BOOL,
        doc="Run Inductor's joint-graph passes (pattern rewrites, constant folding) on the FX graph before torchair's passes.")
    aot_config_enable_joint_graph = Option(
        False, kind=BOOL, effect=NOT_SUPPORTED,
        why="torchair compiles inference graphs; training graphs run through AOTAutograd's default partition",
        doc="Compile the joint forward+backward graph.")
    aot_config_output_loss_index = Option(
        0, kind=ANY, effect=NOT_SUPPORTED,
        why="torchair compiles inference graphs (see aot_config_enable_joint_graph)",
        doc="Which output is the loss in the joint graph.")
    topology_sorting_strategy = _ge("DFS", "GE topological sort order.",
                                    allowed=("BFS", "DFS", "RDFS", "StableRDFS"))
    enable_ref_data = _ge(False, "GE RefData for mutated inputs.", kind=BOOL)
    enable_view_optimize = _ge(True, "GE view optimization.", kind=BOOL)
    remove_noop_ops = Option(
        True, kind=BOOL,
        doc="Remove ops that return their input unchanged (full slices, repeat(1,..), zero pads, cat of one, pow(x, 1), ceil of ints, unneeded clones).")
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
    aclgraph = SubConfig(AclGraphExperimentalConfig, doc="Ascend static-shape kernels.")


class InferenceConfig(ConfigNode):
    """``inference_config``: options for inference graphs."""

    peer_name = "_InferenceConfig"
    dynamic_gears_merge_policy = Option(
        "zip",
        allowed=("zip", "product"),
        doc="How the gears of several inputs combine: 'zip' pairs the i-th gears, 'product' takes every combination.",
    )


class AoeConfig(ConfigNode):
    """``aoe_config``: Ascend Optimization Engine tuning."""

    peer_name = "_AoeConfig"
    _WHY = "AOE is Ascend's kernel/graph auto-tuner; Inductor autotunes its own kernels here"
    aoe_mode = Option(None, allowed=(None, "2"), effect=NO_EFFECT, why=_WHY, doc="AOE tuning mode.")
    work_path = Option("./", kind=DIR, effect=NO_EFFECT, why=_WHY, doc="AOE work directory.")
    aoe_config_file = Option(None, kind=FILE, effect=NO_EFFECT, why=_WHY, doc="AOE config file.")


class ExportExperimentalConfig(ConfigNode):
    """``export.experimental``: options of ``torchair.dynamo_export``."""

    peer_name = "_ExportExperimentalConfig"
    enable_record_nn_module_stack = Option(False, kind=BOOL,
                                           doc="Record each op's nn_module_stack in the "
                                               "export's dynamo.pbtxt.")
    auto_atc_config_generated = Option(False, kind=BOOL, effect=NO_EFFECT,
                                       why="ATC's model_relation_config.json / numa_config.json "
                                           "feed Ascend's offline compiler; the .pt2 packages "
                                           "of dynamo_export need no such config",
                                       doc="Generate an ATC config next to the export.")
    enable_lite_export = Option(False, kind=BOOL, effect=NO_EFFECT,
                                why="the lite GE converters do not exist here; dynamo_export "
                                    "compiles the ATen graph with AOTInductor",
                                doc="Export with the lite converters.")


class ExportConfig(ConfigNode):
    """``export``: offline export. TorchAir's ``dynamo_export`` fills these from its arguments."""

    peer_name = "_ExportConfig"
    _SET_BY_EXPORT = ("dynamo_export takes the directory and file name as its export_path / "
                      "export_name arguments and finds the weights itself")
    export_mode = Option(False, kind=BOOL, effect=NOT_SUPPORTED,
                         why="exporting from a torch.compile backend with export_mode=True is not "
                             "supported: call torchair.dynamo_export(*inputs, model=model, ...)",
                         doc="Offline export.")
    export_path_dir = Option("./", kind=DIR, effect=NO_EFFECT, why=_SET_BY_EXPORT,
                             doc="Export output directory.")
    export_name = Option(None, kind=ANY, effect=NO_EFFECT, why=_SET_BY_EXPORT,
                         doc="Export file name.")
    weight_name = Option(None, kind=ANY, effect=NO_EFFECT, why=_SET_BY_EXPORT,
                         doc="Weight file name.")
    inputs_name = Option(None, kind=ANY, effect=NO_EFFECT, why=_SET_BY_EXPORT,
                         doc="Input names.")
    experimental = SubConfig(ExportExperimentalConfig, doc="Experimental export options.")


class DumpConfig(ConfigNode):
    """``dump_config``: device-side tensor dumps of Ascend's runtime."""

    peer_name = "_DataDumpConfig"
    _WHY = "device-side dumps of Ascend's GE/ACL runtime; use debug.data_dump (per-op .npy) here"
    enable_dump = Option(False, kind=BOOL, effect=NO_EFFECT, why=_WHY, doc="Enable the dump.")
    dump_path = Option("./", kind=DIR, effect=NO_EFFECT, why=_WHY, doc="Dump root directory.")
    dump_mode = Option("all", allowed=("input", "output", "all"), effect=NO_EFFECT, why=_WHY,
                       doc="Which tensors of each op.")
    quant_dumpable = Option(False, kind=BOOL, effect=NO_EFFECT, why=_WHY,
                            doc="Dump quantization ops too.")
    dump_step = Option("", kind=Regex(r"^(((\d+)|(\d+-{0,1}\d+))\|{0,1})*$", "0|1|2-5|6"),
                       effect=NO_EFFECT, why=_WHY, doc="Steps to dump, e.g. '0|1|2-5'.")
    dump_layer = Option("", kind=Regex(r'^[0-9a-zA-Z_" "/\\.]*$', "Mul_1 Add1 Conv2D_1"),
                        effect=NO_EFFECT, why=_WHY, doc="Layers to dump, space separated.")
    dump_data = Option("tensor", allowed=("tensor", "stats"), effect=NO_EFFECT, why=_WHY,
                       doc="Full tensors or statistics.")
    dump_config_path = Option(None, kind=JSON_FILE, effect=NO_EFFECT, why=_WHY,
                              doc="ACL dump config (.json).")
    data_dump_stage = Option("optimized", allowed=("original", "optimized"), effect=NO_EFFECT,
                             why=_WHY, doc="Dump stage of captured graphs.")


class FusionConfig(ConfigNode):
    """``fusion_config``: GE fusion switches."""

    peer_name = "_FusionConfig"
    fusion_switch_file = _ge(None, "GE fusion switch file.", kind=FILE)


class GeConfig(ConfigNode):
    """``ge_config``: Graph Engine options."""

    peer_name = "_GEConfig"
    enable_single_stream = _ge(False, "Run the GE graph on one stream.", kind=BOOL)
    oo_level = _ge("O3", "GE optimization level.", allowed=("O1", "O3"))
    oo_constant_folding = _ge(None, "GE constant folding.", allowed=(None, True, False))
    oo_dead_code_elimination = _ge(None, "GE dead-code elimination.", allowed=(None, True, False))
    export_compile_stat = _ge("2", "GE compile statistics.", allowed=("0", "1", "2"))
    aicore_num = _ge(None, "GE AI-core count.", kind=ANY)
    optimization_switch = _ge(None, "GE optimization switches.", kind=ANY)


class AclGraphConfig(ConfigNode):
    """``aclgraph_config``: graph-capture memory and kernels."""

    peer_name = "_AclgraphConfig"
    use_custom_pool = Option(
        None, kind=ANY, effect=NOT_SUPPORTED,
        why="CUDA graphs here capture into the pool torch.cuda.graphs picks",
        doc="Memory pool handle to capture into.")
    kernel_aot_optimization = Option(False, kind=BOOL, effect=NO_EFFECT, why=_ACLNN,
                                     doc="Ahead-of-time kernel optimization.")
    kernel_aot_optimization_build_dir = Option(None, kind=ANY, effect=NO_EFFECT, why=_ACLNN,
                                               doc="Build directory of those kernels.")


class NpuGraphExConfig(ConfigNode):
    """``npugraphex_config``: holds nothing settable (as in TorchAir)."""

    peer_name = "_NpuGraphExConfig"


class CompilerConfig(ConfigNode):
    """Root of the TorchAir compiler configuration.

    Helpers (inherited from :class:`ConfigNode`): ``as_dict()``, ``options()``, ``get(name)``,
    ``compute_hash()``, ``copy()``, ``describe()``, ``registry()``; ``==`` compares the flat
    options and ``repr`` lists the non-default ones. Reading an option gives TorchAir's
    ``OptionValue`` (``config.mode.value``); path options read back as ``str``.
    """

    peer_name = "CompilerConfig"
    debug = SubConfig(DebugConfig, doc="Debugging aids.")
    aoe_config = SubConfig(AoeConfig, doc="AOE tuning (Ascend).")
    export = SubConfig(ExportConfig, doc="Offline export.")
    dump_config = SubConfig(DumpConfig, doc="Device-side dumps (Ascend).")
    fusion_config = SubConfig(FusionConfig, doc="GE fusion (Ascend).")
    experimental_config = SubConfig(ExperimentalConfig, doc="Experimental features.")
    inference_config = SubConfig(InferenceConfig, doc="Inference options.")
    ge_config = SubConfig(GeConfig, doc="Graph Engine options (Ascend).")
    aclgraph_config = SubConfig(AclGraphConfig, doc="Graph capture options.")
    npugraphex_config = SubConfig(NpuGraphExConfig, doc="npugraph_ex options.")
    mode = Option(
        "max-autotune",
        allowed=("max-autotune", "reduce-overhead", "npugraph_ex"),
        doc="'max-autotune': compile static graphs with Inductor-generated kernels launched as one unit; 'reduce-overhead' (alias 'npugraph_ex'): no codegen, run the FX graph's ATen ops and cut launch overhead with CUDA graphs on CUDA.",
    )
    post_grad_custom_pre_pass = Option(
        None, kind=CALLABLE,
        doc="Callable(gm, example_inputs, config) run on the FX graph before torchair's passes; mutate gm in place (the return value is ignored).")
    post_grad_custom_post_pass = Option(
        None, kind=CALLABLE,
        doc="Callable(gm, example_inputs, config) run on the FX graph after torchair's passes; mutate gm in place.")
