import copy
import logging
import os
import pickle
import re

import pytest

from torchair.configs import CompilerConfig
from torchair.configs._option import ConfigNode, Option, OptionValue

# TorchAir's option tree (python/torchair/configs/*.py): every option with its default. Written
# out by hand from TorchAir's sources, independent of torchair's declarations.
DEFAULTS = {
    "mode": "max-autotune",
    "post_grad_custom_pre_pass": None,
    "post_grad_custom_post_pass": None,
    "debug.run_eagerly": False,
    "debug.graph_dump.type": None,
    "debug.graph_dump.path": None,
    "debug.data_dump.type": None,
    "debug.data_dump.filter": None,
    "debug.data_dump.path": None,
    "debug.fx_summary.type": None,
    "debug.fx_summary.skip_compile": True,
    "debug.fx_summary.path": None,
    "debug.aclgraph.disable_reinplace_inplaceable_ops_pass": False,
    "debug.aclgraph.disable_reinplace_input_mutated_ops_pass": False,
    "debug.aclgraph.disable_mempool_reuse_in_same_fx": False,
    "debug.aclgraph.enable_output_clone": False,
    "debug.aclgraph.static_capture_size_limit": 64,
    "debug.aclgraph.clone_input": True,
    "aoe_config.aoe_mode": None,
    "aoe_config.work_path": "./",
    "aoe_config.aoe_config_file": None,
    "export.export_mode": False,
    "export.export_path_dir": "./",
    "export.export_name": None,
    "export.weight_name": None,
    "export.inputs_name": None,
    "export.experimental.enable_record_nn_module_stack": False,
    "export.experimental.auto_atc_config_generated": False,
    "export.experimental.enable_lite_export": False,
    "dump_config.enable_dump": False,
    "dump_config.dump_path": "./",
    "dump_config.dump_mode": "all",
    "dump_config.quant_dumpable": False,
    "dump_config.dump_step": "",
    "dump_config.dump_layer": "",
    "dump_config.dump_data": "tensor",
    "dump_config.dump_config_path": None,
    "dump_config.data_dump_stage": "optimized",
    "fusion_config.fusion_switch_file": None,
    "experimental_config.cc_parallel_enable": False,
    "experimental_config.keep_inference_input_mutations": True,
    "experimental_config.memory_efficiency": False,
    "experimental_config.frozen_parameter": False,
    "experimental_config.static_model_ops_lower_limit": None,
    "experimental_config.jit_compile": "auto",
    "experimental_config.npu_fx_pass": False,
    "experimental_config.aot_config_enable_joint_graph": False,
    "experimental_config.aot_config_output_loss_index": 0,
    "experimental_config.topology_sorting_strategy": "DFS",
    "experimental_config.enable_ref_data": False,
    "experimental_config.enable_view_optimize": True,
    "experimental_config.remove_noop_ops": True,
    "experimental_config.tiling_schedule_optimize": False,
    "experimental_config.pattern_fusion_pass": True,
    "experimental_config.aclgraph._aclnn_static_shape_kernel": False,
    "experimental_config.aclgraph._aclnn_static_shape_kernel_build_dir": None,
    "experimental_config.aclgraph._aclnn_static_shape_kernel_sym_value_range": None,
    "experimental_config.aclgraph._aclnn_static_shape_kernel_sym_index": 0,
    "inference_config.dynamic_gears_merge_policy": "zip",
    "ge_config.enable_single_stream": False,
    "ge_config.oo_level": "O3",
    "ge_config.oo_constant_folding": None,
    "ge_config.oo_dead_code_elimination": None,
    "ge_config.export_compile_stat": "2",
    "ge_config.aicore_num": None,
    "ge_config.optimization_switch": None,
    "aclgraph_config.use_custom_pool": None,
    "aclgraph_config.kernel_aot_optimization": False,
    "aclgraph_config.kernel_aot_optimization_build_dir": None,
}
# torchair's own additions to TorchAir's tree (none) and where it stores differently: an int
# list option set to None stores [] (as TorchAir)
STORED_DEFAULTS = dict(DEFAULTS, **{
    "experimental_config.aclgraph._aclnn_static_shape_kernel_sym_value_range": []})

ALLOWED = {
    "mode": ["max-autotune", "reduce-overhead", "npugraph_ex"],
    "debug.run_eagerly": [True, False],
    "debug.graph_dump.type": [None, "txt", "pbtxt", "py"],
    "debug.graph_dump.path": [None, os.path.realpath("/tmp/dumps")],  # relative: see below
    "debug.data_dump.type": [None, "npy"],
    "debug.fx_summary.type": [None, "csv"],
    "experimental_config.tiling_schedule_optimize": [True, False],
    "experimental_config.pattern_fusion_pass": [True, False],
    "experimental_config.frozen_parameter": [True, False],
    "experimental_config.topology_sorting_strategy": ["BFS", "DFS", "RDFS", "StableRDFS"],
    "experimental_config.static_model_ops_lower_limit": [-1, 0, 2**63 - 1],
    "debug.aclgraph.static_capture_size_limit": [1, 128],
    "dump_config.dump_mode": ["input", "output", "all"],
    "dump_config.dump_step": ["0|1|2-5|6", "3"],
    "ge_config.oo_level": ["O1", "O3"],
    "ge_config.export_compile_stat": ["0", "1", "2"],
    "inference_config.dynamic_gears_merge_policy": ["zip", "product"],
}

# (option, bad value, error type, TorchAir's text)
BAD = [
    ("debug.graph_dump.type", "abc", ValueError,
     "Value 'abc' (type: <class 'str'>) not in optional list ['txt', 'pbtxt', 'py'] "
     "(type: <class 'str'>)."),
    ("debug.run_eagerly", 2, ValueError,
     "Value 2 (type: <class 'int'>) not in optional list [True, False] (type: <class 'bool'>)."),
    ("debug.aclgraph.static_capture_size_limit", 0, ValueError,
     "Please set value in [1, 9223372036854775807], 0 is out of range."),
    ("debug.aclgraph.static_capture_size_limit", "8", ValueError,
     "Please set integer type, but got <class 'str'>"),
    ("post_grad_custom_pre_pass", 3, TypeError, "value must be Callable or None, got <class 'int'>"),
    ("experimental_config.aclgraph._aclnn_static_shape_kernel_build_dir", 3, TypeError,
     "value must be str or None, got <class 'int'>"),
    ("experimental_config.aclgraph._aclnn_static_shape_kernel_sym_value_range", "1", TypeError,
     "the set value must be None or list, got <class 'str'>"),
    ("experimental_config.aclgraph._aclnn_static_shape_kernel_sym_value_range", [1, "2"],
     TypeError, "the set value must be int list, got list type: [<class 'int'>, <class 'str'>]"),
    ("aoe_config.work_path", "/no/such/dir", FileNotFoundError,
     "Please set legal dir path, /no/such/dir is not found or is not a file directory!"),
    ("fusion_config.fusion_switch_file", "/no/such/file", FileNotFoundError,
     "Please set legal file path, /no/such/file is not found or is not a file!"),
    ("dump_config.dump_config_path", "", ValueError, "File path cannot be empty!"),
    ("dump_config.dump_step", "1,2", ValueError,
     "Please set legal regex value format match ^(((\\d+)|(\\d+-{0,1}\\d+))\\|{0,1})*$, 1,2 is "
     "Illegal format, correct example:0|1|2-5|6."),
    ("mode", "fast", ValueError, "Value 'fast' (type: <class 'str'>) not in optional list "
                                 "['max-autotune', 'reduce-overhead', 'npugraph_ex']"),
]


def _node_and_leaf(config, dotted):
    *parents, leaf = dotted.split(".")
    node = config
    for p in parents:
        node = getattr(node, p)
    return node, leaf


def _get(config, dotted):
    node, leaf = _node_and_leaf(config, dotted)
    return getattr(node, leaf)


def _set(config, dotted, value):
    node, leaf = _node_and_leaf(config, dotted)
    setattr(node, leaf, value)


# --------------------------------------------------------------------- defaults
def test_defaults():
    config = CompilerConfig()
    assert config.options() == STORED_DEFAULTS
    assert config.mode == "max-autotune" and config.mode.value == "max-autotune"
    assert config.debug.graph_dump.type.value is None
    assert config.debug.graph_dump.path is None  # a path reads back as str / None (TorchAir)
    assert config.debug.run_eagerly == False and not config.debug.run_eagerly  # noqa: E712
    assert config.debug.run_eagerly.value == "0"
    assert config.experimental_config.pattern_fusion_pass.value == "1"
    assert config.debug.aclgraph.static_capture_size_limit.value == "64"
    assert config.inference_config.dynamic_gears_merge_policy.value == "zip"


def test_every_torchair_option_exists_and_nothing_else():
    assert set(CompilerConfig.registry()) == set(DEFAULTS)


def test_option_value_reads_and_writes_like_torchair():
    config = CompilerConfig()
    opt = config.experimental_config.frozen_parameter
    assert isinstance(opt, OptionValue)
    assert opt.default is False and opt.optional == [True, False]
    opt.value = True  # TorchAir scripts may set through .value
    assert config.experimental_config.frozen_parameter.value == "1"
    assert bool(config.experimental_config.frozen_parameter)
    with pytest.raises(ValueError, match="not in optional list"):
        opt.value = "yes"
    config.mode = CompilerConfig().mode  # an OptionValue assigns its value
    assert config.get("mode") == "max-autotune"
    assert config.debug.graph_dump.type.optional == ["txt", "pbtxt", "py"]
    assert config.get("debug.aclgraph.static_capture_size_limit") == 64


@pytest.mark.parametrize("dotted,value,error,text", BAD)
def test_bad_values_raise_torchair_error_type_and_text(dotted, value, error, text):
    config = CompilerConfig()
    with pytest.raises(error) as info:
        _set(config, dotted, value)
    assert text in str(info.value)
    assert f"'{dotted}'" in str(info.value)  # and the option is named
    assert config.options() == STORED_DEFAULTS


def test_no_effect_options_log_once_at_info_and_describe_says_so(torchair_log):
    from torchair.configs import _option

    _option._logged.discard("ge_config.oo_level")
    config = CompilerConfig()
    config.ge_config.oo_level = "O1"
    config.ge_config.oo_level = "O1"
    CompilerConfig().ge_config.oo_level = "O1"
    hits = [r for r in torchair_log if "ge_config.oo_level" in r.getMessage()]
    assert len(hits) == 1 and hits[0].levelno == logging.INFO
    assert "no effect here" in hits[0].getMessage()
    row = next(line for line in CompilerConfig.describe().splitlines()
               if line.startswith("ge_config.oo_level "))
    assert "no effect here" in row
    works = next(line for line in CompilerConfig.describe().splitlines()
                 if line.startswith("debug.run_eagerly "))
    assert " works " in works
    # setting a default value logs nothing
    _option._logged.discard("ge_config.enable_single_stream")
    config.ge_config.enable_single_stream = False
    assert not [r for r in torchair_log if "enable_single_stream" in r.getMessage()]


def test_instances_do_not_share_state():
    a, b = CompilerConfig(), CompilerConfig()
    a.debug.run_eagerly = True
    a.mode = "reduce-overhead"
    assert b.debug.run_eagerly == False  # noqa: E712
    assert b.mode == "max-autotune"


# ------------------------------------------------------------ allowed values
@pytest.mark.parametrize(
    "dotted,value", [(k, v) for k, vs in ALLOWED.items() for v in vs]
)
def test_every_allowed_value(dotted, value):
    config = CompilerConfig()
    _set(config, dotted, value)
    assert _get(config, dotted) == value
    assert config.options()[dotted] == value
    # nothing else moved
    others = {k: v for k, v in config.options().items() if k != dotted}
    assert others == {k: v for k, v in STORED_DEFAULTS.items() if k != dotted}


def test_path_accepts_pathlike_and_stores_str(tmp_path):
    config = CompilerConfig()
    config.debug.graph_dump.path = tmp_path
    assert config.debug.graph_dump.path == str(tmp_path)
    assert isinstance(config.debug.graph_dump.path, str)
    other = CompilerConfig()
    other.debug.graph_dump.path = str(tmp_path)
    assert config == other
    assert config.compute_hash() == other.compute_hash()


# ------------------------------------------------------------ unknown options
@pytest.mark.parametrize(
    "node_path,name,valid",
    [
        ("", "modee", ["mode", "debug", "experimental_config", "inference_config"]),
        ("debug", "run_eager", ["run_eagerly", "graph_dump"]),
        ("debug.graph_dump", "format", ["type", "path"]),
        (
            "experimental_config",
            "frozen_parameters",
            ["tiling_schedule_optimize", "pattern_fusion_pass", "frozen_parameter"],
        ),
        ("inference_config", "merge_policy", ["dynamic_gears_merge_policy"]),
    ],
)
def test_unknown_option_at_each_level(node_path, name, valid):
    config = CompilerConfig()
    node = config
    for part in filter(None, node_path.split(".")):
        node = getattr(node, part)
    dotted = f"{node_path}.{name}" if node_path else name
    with pytest.raises(ValueError) as info:
        setattr(node, name, True)
    msg = str(info.value)
    assert f"'{dotted}'" in msg
    for v in valid:
        assert v in msg
    # the failed assignment did not create an attribute
    assert config.options() == STORED_DEFAULTS
    # reading an unknown option is an AttributeError with the same hints
    with pytest.raises(AttributeError, match=re.escape(dotted)):
        getattr(node, name)
    assert not hasattr(node, name)


def test_unknown_option_suggests_closest():
    config = CompilerConfig()
    with pytest.raises(ValueError, match=r"did you mean 'debug\.run_eagerly'"):
        config.debug.run_eager = True
    with pytest.raises(ValueError, match=r"did you mean 'experimental_config\.frozen_parameter'"):
        config.experimental_config.frozen_parameters = True
    with pytest.raises(ValueError) as info:
        config.zzzzzz = 1
    assert "did you mean" not in str(info.value)


def test_private_names_rejected_too():
    config = CompilerConfig()
    with pytest.raises(ValueError, match="unknown option '_prefix'"):
        config._prefix = "x"


# ---------------------------------------------------------------- bad values
@pytest.mark.parametrize(
    "dotted,value,allowed",
    [
        ("mode", "fast", ["'max-autotune'", "'reduce-overhead'"]),
        ("mode", None, ["'max-autotune'", "'reduce-overhead'"]),
        ("debug.graph_dump.type", "json", ["None", "'txt'", "'pbtxt'", "'py'"]),
        ("debug.graph_dump.type", "TXT", ["'txt'"]),
        ("inference_config.dynamic_gears_merge_policy", "cartesian", ["'zip'", "'product'"]),
    ],
)
def test_value_outside_allowed_set(dotted, value, allowed):
    config = CompilerConfig()
    with pytest.raises(ValueError) as info:
        _set(config, dotted, value)
    msg = str(info.value)
    assert f"'{dotted}'" in msg
    assert repr(value) in msg
    for a in allowed:
        assert a in msg
    assert config.options() == STORED_DEFAULTS


@pytest.mark.parametrize(
    "dotted,value",
    [
        ("debug.run_eagerly", 1),
        ("debug.run_eagerly", 0),
        ("debug.run_eagerly", "yes"),
        ("debug.run_eagerly", None),
        ("experimental_config.tiling_schedule_optimize", 1.0),
        ("experimental_config.pattern_fusion_pass", "False"),
        ("experimental_config.frozen_parameter", [True]),
    ],
)
def test_bool_options_reject_non_bools(dotted, value):
    config = CompilerConfig()
    with pytest.raises(ValueError) as info:
        _set(config, dotted, value)
    msg = str(info.value)
    assert f"'{dotted}'" in msg
    assert repr(value) in msg
    assert "bool" in msg
    assert config.options() == STORED_DEFAULTS


@pytest.mark.parametrize("value", [3, b"/tmp", True, ["/tmp"]])
def test_path_rejects_non_paths(value):
    config = CompilerConfig()
    with pytest.raises(ValueError, match=r"str or os\.PathLike.*'debug\.graph_dump\.path'"):
        config.debug.graph_dump.path = value


# ------------------------------------------------------------ dump directories (issue 33)
DUMP_PATHS = ["debug.graph_dump.path", "debug.data_dump.path", "debug.fx_summary.path"]


@pytest.mark.parametrize("dotted", DUMP_PATHS)
def test_dump_path_that_is_a_file_fails_when_set(dotted, tmp_path):
    """Was: accepted, then every call raised a raw OSError. Now TorchAir's error for a bad dir
    path (FileNotFoundError, 'Please set legal dir path, ...') when set, naming the option, the
    path and the fix; the option keeps its value."""
    config = CompilerConfig()
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    for bad, why in [(str(a_file), f"{a_file} is an existing file"),
                     ("/etc/passwd/x", "/etc/passwd is a file, so no directory /etc/passwd/x "
                                       "can be created under it")]:
        with pytest.raises(FileNotFoundError) as info:
            _set(config, dotted, bad)
        msg = str(info.value)
        assert msg.startswith(f"Please set legal dir path, {bad} is not found or is not a file "
                              f"directory! {why}: set the path of a directory"), msg
        assert f"Option '{dotted}' expects None or a directory" in msg
        assert _get(config, dotted) is None


@pytest.mark.parametrize("dotted", DUMP_PATHS)
def test_dump_path_not_writable_fails_when_set(dotted, tmp_path, monkeypatch):
    """A read-only directory (simulated: tests run as root, and root may write anywhere)."""
    readonly = str(tmp_path / "ro")
    os.mkdir(readonly)
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: (
        False if os.fspath(p) == readonly else real_access(p, mode, **kw)))
    config = CompilerConfig()
    with pytest.raises(PermissionError, match=rf"^The path permission check failed: {readonly}\. "
                                              rf"{readonly} is not writable by this process: "
                                              rf"choose a directory it can write\. Option "
                                              rf"'{re.escape(dotted)}' expects"):
        _set(config, dotted, readonly)
    with pytest.raises(PermissionError, match=rf"failed: {readonly}\. {readonly}, where "
                                              rf"{readonly}/new/sub would be created, is not"):
        _set(config, dotted, readonly + "/new/sub")


@pytest.mark.parametrize("dotted", DUMP_PATHS)
def test_dump_path_missing_but_creatable_is_accepted_as_its_real_path(dotted, tmp_path,
                                                                        monkeypatch):
    config = CompilerConfig()
    _set(config, dotted, str(tmp_path / "new" / "sub"))
    assert _get(config, dotted) == str(tmp_path / "new" / "sub")
    assert not (tmp_path / "new").exists()  # created by the first dump, not here
    monkeypatch.chdir(tmp_path)  # relative: stored as the real path (TorchAir's realpath)
    _set(config, dotted, "rel/dir")
    assert _get(config, dotted) == os.path.realpath(tmp_path / "rel" / "dir")
    _set(config, dotted, None)
    assert _get(config, dotted) is None


def test_a_dump_directory_is_created_and_a_later_bad_one_is_named(tmp_path):
    """Accepted when missing, created by the first dump; a directory that turns bad after the
    option was set fails with TorchAir's dump-time type and text (RuntimeError 'Failed to make
    directory: ...'), naming the option instead of a raw OSError."""
    import torch

    import torchair

    config = CompilerConfig()
    config.debug.run_eagerly = True
    config.debug.graph_dump.type = "txt"
    config.debug.graph_dump.path = str(tmp_path / "new" / "graphs")
    fn = torch.compile(lambda x: x + 1, backend=torchair.get_npu_backend(compiler_config=config))
    fn(torch.ones(2))
    assert len(os.listdir(tmp_path / "new" / "graphs")) == 2  # original and optimized

    config.debug.graph_dump.path = str(tmp_path / "later")
    (tmp_path / "later").write_text("")  # a file now stands where the directory was to be
    torch._dynamo.reset()
    fn = torch.compile(lambda x: x + 2, backend=torchair.get_npu_backend(compiler_config=config))
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed,
                       match=rf"RuntimeError: Failed to make directory: {tmp_path}/later "
                             rf"\(FileExistsError: File exists\); set "
                             rf"config\.debug\.graph_dump\.path to a directory"):
        fn(torch.ones(2))


def test_allowed_values_do_not_confuse_bool_and_int():
    class Node(ConfigNode):
        level = Option(0, allowed=(0, 1), doc="level")

    node = Node()
    node.level = 1
    with pytest.raises(ValueError, match="Option 'level' allows: 0, 1"):
        node.level = True


# ---------------------------------------------------------------- sub-nodes
@pytest.mark.parametrize(
    "node_path,name",
    [
        ("", "debug"),
        ("", "experimental_config"),
        ("", "inference_config"),
        ("debug", "graph_dump"),
    ],
)
def test_assigning_sub_node_raises(node_path, name):
    config = CompilerConfig()
    node = config
    for part in filter(None, node_path.split(".")):
        node = getattr(node, part)
    before = getattr(node, name)
    dotted = f"{node_path}.{name}" if node_path else name
    for value in (3, CompilerConfig().debug, None):
        with pytest.raises(ValueError, match=re.escape(f"'{dotted}'")):
            setattr(node, name, value)
    assert getattr(node, name) is before


def test_options_cannot_be_deleted():
    config = CompilerConfig()
    with pytest.raises(AttributeError):
        del config.mode
    with pytest.raises(AttributeError):
        del config.debug


# --------------------------------------------------------------------- views
def test_as_dict_nested():
    config = CompilerConfig()
    config.debug.graph_dump.type = "py"
    d = config.as_dict()
    assert d["mode"] == "max-autotune"
    assert d["debug"]["graph_dump"] == {"type": "py", "path": None}
    assert d["debug"]["run_eagerly"] is False
    assert d["experimental_config"]["aclgraph"]["_aclnn_static_shape_kernel"] is False
    # a plain dict: mutating it does not touch the config
    d["debug"]["graph_dump"]["type"] = "txt"
    assert config.debug.graph_dump.type == "py"
    assert config.debug.as_dict()["graph_dump"] == {"type": "py", "path": None}


def test_options_flat():
    config = CompilerConfig()
    config.inference_config.dynamic_gears_merge_policy = "product"
    flat = config.options()
    assert set(flat) == set(DEFAULTS)
    assert flat["inference_config.dynamic_gears_merge_policy"] == "product"
    # sub-node options are relative to the node
    assert config.debug.graph_dump.options() == {"type": None, "path": None}
    assert config.debug.options()["aclgraph.clone_input"] is True


def test_callable_options_hash_by_name_and_source():
    def my_pass(gm, example_inputs, config):
        return None

    a, b = CompilerConfig(), CompilerConfig()
    a.post_grad_custom_pre_pass = my_pass
    b.post_grad_custom_pre_pass = my_pass
    assert a.compute_hash() == b.compute_hash() != CompilerConfig().compute_hash()
    b.post_grad_custom_pre_pass = lambda gm, inputs, config: None
    assert a.compute_hash() != b.compute_hash()


def test_compute_hash():
    a, b = CompilerConfig(), CompilerConfig()
    h = a.compute_hash()
    assert re.fullmatch(r"[0-9a-f]{64}", h)
    assert h == b.compute_hash()
    assert h == a.compute_hash()  # stable across calls

    seen = {h}
    for dotted, values in ALLOWED.items():
        for value in values:
            if value == DEFAULTS[dotted] and type(value) is type(DEFAULTS[dotted]):
                continue
            c = CompilerConfig()
            _set(c, dotted, value)
            hc = c.compute_hash()
            assert hc != h, (dotted, value)
            seen.add(hc)
    # every single-option change produces a distinct key
    n_changes = sum(
        1 for k, vs in ALLOWED.items() for v in vs if not (v == DEFAULTS[k] and type(v) is type(DEFAULTS[k]))
    )
    assert len(seen) == n_changes + 1

    # order of assignments does not matter
    x, y = CompilerConfig(), CompilerConfig()
    x.mode = "reduce-overhead"
    x.debug.run_eagerly = True
    y.debug.run_eagerly = True
    y.mode = "reduce-overhead"
    assert x.compute_hash() == y.compute_hash()
    # setting back to the default restores the hash
    x.mode = "max-autotune"
    x.debug.run_eagerly = False
    assert x.compute_hash() == h


def test_equality():
    a, b = CompilerConfig(), CompilerConfig()
    assert a == b
    a.experimental_config.frozen_parameter = True
    assert a != b
    b.experimental_config.frozen_parameter = True
    assert a == b
    assert a != "not a config"
    with pytest.raises(TypeError):
        hash(a)  # mutable: use compute_hash() as a key


# ---------------------------------------------------------------------- copy
@pytest.mark.parametrize("copier", [lambda c: c.copy(), copy.deepcopy, copy.copy])
def test_copy_is_independent(copier):
    config = CompilerConfig()
    config.mode = "reduce-overhead"
    config.debug.graph_dump.type = "txt"
    dup = copier(config)
    assert dup == config
    assert dup is not config
    assert dup.debug is not config.debug
    assert dup.debug.graph_dump is not config.debug.graph_dump
    dup.debug.graph_dump.type = "py"
    dup.experimental_config.pattern_fusion_pass = False
    assert config.debug.graph_dump.type == "txt"
    assert config.experimental_config.pattern_fusion_pass == True  # noqa: E712
    assert dup != config
    # copies keep validating with full dotted names
    with pytest.raises(ValueError, match=r"'debug\.graph_dump\.type'"):
        dup.debug.graph_dump.type = "json"
    with pytest.raises(ValueError, match=r"_DebugConfig has no option nope, all options .*unknown option 'debug\.nope'"):
        dup.debug.nope = 1


def test_pickle_roundtrip():
    config = CompilerConfig()
    config.debug.run_eagerly = True
    again = pickle.loads(pickle.dumps(config))
    assert again == config
    assert again.compute_hash() == config.compute_hash()
    with pytest.raises(ValueError, match=r"'debug\.run_eagerly'"):
        again.debug.run_eagerly = 1


# ---------------------------------------------------------------------- repr
def test_repr_shows_changed_options():
    config = CompilerConfig()
    assert repr(config) == "CompilerConfig()"
    config.mode = "reduce-overhead"
    config.debug.graph_dump.type = "pbtxt"
    r = repr(config)
    assert "mode='reduce-overhead'" in r
    assert "debug.graph_dump.type='pbtxt'" in r
    assert "run_eagerly" not in r
    assert "dynamic_gears_merge_policy" not in r
    # back to default -> hidden again
    config.mode = "max-autotune"
    assert "mode" not in repr(config)


# ------------------------------------------------------------------ describe
def test_describe_table():
    text = CompilerConfig.describe()
    assert text == CompilerConfig().describe()
    lines = text.splitlines()
    assert lines[0].split()[:5] == ["option", "default", "allowed", "effect", "doc"]
    body = lines[2:]
    assert len(body) == len(DEFAULTS)
    names = [line.split()[0] for line in body]
    assert set(names) == set(DEFAULTS)
    for line in body:
        name = line.split()[0]
        assert repr(DEFAULTS[name]) in line
        assert any(e in line for e in (" works ", " no effect here ", " not supported "))
    row = {line.split()[0]: line for line in body}
    assert "'max-autotune' | 'reduce-overhead' | 'npugraph_ex'" in row["mode"]
