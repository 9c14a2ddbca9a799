import copy
import pickle
import re

import pytest

from torchair.configs import CompilerConfig
from torchair.configs._option import BOOL, ConfigNode, Option

DEFAULTS = {
    "mode": "max-autotune",
    "debug.run_eagerly": False,
    "debug.graph_dump.type": None,
    "debug.graph_dump.path": None,
    "experimental_config.tiling_schedule_optimize": False,
    "experimental_config.pattern_fusion_pass": True,
    "experimental_config.frozen_parameter": False,
    "inference_config.dynamic_gears_merge_policy": "zip",
}

ALLOWED = {
    "mode": ["max-autotune", "reduce-overhead"],
    "debug.run_eagerly": [True, False],
    "debug.graph_dump.type": [None, "txt", "pbtxt", "py"],
    "debug.graph_dump.path": [None, "/tmp/dumps", "relative/dir"],
    "experimental_config.tiling_schedule_optimize": [True, False],
    "experimental_config.pattern_fusion_pass": [True, False],
    "experimental_config.frozen_parameter": [True, False],
    "inference_config.dynamic_gears_merge_policy": ["zip", "product"],
}


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
    assert config.mode == "max-autotune"
    assert config.debug.graph_dump.type is None
    assert config.debug.graph_dump.path is None
    assert config.debug.run_eagerly is False
    assert config.experimental_config.tiling_schedule_optimize is False
    assert config.experimental_config.pattern_fusion_pass is True
    assert config.experimental_config.frozen_parameter is False
    assert config.inference_config.dynamic_gears_merge_policy == "zip"
    assert config.options() == DEFAULTS


def test_instances_do_not_share_state():
    a, b = CompilerConfig(), CompilerConfig()
    a.debug.run_eagerly = True
    a.mode = "reduce-overhead"
    assert b.debug.run_eagerly is False
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
    assert others == {k: v for k, v in DEFAULTS.items() if k != dotted}


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
    assert config.options() == DEFAULTS
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
    assert config.options() == DEFAULTS


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
    assert config.options() == DEFAULTS


@pytest.mark.parametrize("value", [3, b"/tmp", True, ["/tmp"]])
def test_path_rejects_non_paths(value):
    config = CompilerConfig()
    with pytest.raises(ValueError, match=r"'debug\.graph_dump\.path'.*str or os\.PathLike"):
        config.debug.graph_dump.path = value


def test_allowed_values_do_not_confuse_bool_and_int():
    class Node(ConfigNode):
        level = Option(0, allowed=(0, 1), doc="level")

    node = Node()
    node.level = 1
    with pytest.raises(ValueError, match="allowed values: 0, 1"):
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
    assert d == {
        "mode": "max-autotune",
        "debug": {"run_eagerly": False, "graph_dump": {"type": "py", "path": None}},
        "experimental_config": {
            "tiling_schedule_optimize": False,
            "pattern_fusion_pass": True,
            "frozen_parameter": False,
        },
        "inference_config": {"dynamic_gears_merge_policy": "zip"},
    }
    # a plain dict: mutating it does not touch the config
    d["debug"]["graph_dump"]["type"] = "txt"
    assert config.debug.graph_dump.type == "py"
    assert config.debug.as_dict() == {"run_eagerly": False, "graph_dump": {"type": "py", "path": None}}


def test_options_flat():
    config = CompilerConfig()
    config.inference_config.dynamic_gears_merge_policy = "product"
    flat = config.options()
    assert set(flat) == set(DEFAULTS)
    assert flat["inference_config.dynamic_gears_merge_policy"] == "product"
    # sub-node options are relative to the node
    assert config.debug.options() == {
        "run_eagerly": False,
        "graph_dump.type": None,
        "graph_dump.path": None,
    }


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
    assert config.experimental_config.pattern_fusion_pass is True
    assert dup != config
    # copies keep validating with full dotted names
    with pytest.raises(ValueError, match=r"'debug\.graph_dump\.type'"):
        dup.debug.graph_dump.type = "json"
    with pytest.raises(ValueError, match=r"unknown option 'debug\.nope'"):
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
    assert lines[0].split()[:4] == ["option", "default", "allowed", "doc"]
    body = lines[2:]
    assert len(body) == len(DEFAULTS)
    names = [line.split()[0] for line in body]
    assert set(names) == set(DEFAULTS)
    for line in body:
        name = line.split()[0]
        assert repr(DEFAULTS[name]) in line
    row = {line.split()[0]: line for line in body}
    assert "'max-autotune' | 'reduce-overhead'" in row["mode"]
    assert "bool" in row["debug.run_eagerly"]
    assert "'zip' | 'product'" in row["inference_config.dynamic_gears_merge_policy"]


def test_every_option_has_a_one_line_doc():
    for name, opt in CompilerConfig._iter_decls():
        assert opt.doc and "\n" not in opt.doc, name


def test_option_declaration_validation():
    with pytest.raises(TypeError):
        Option(False, doc="neither allowed nor kind")
    with pytest.raises(TypeError):
        Option(False, allowed=(False,), kind=BOOL, doc="both")
    with pytest.raises((ValueError, RuntimeError)):
        # a default outside its own allowed set is rejected at class creation
        class Bad(ConfigNode):
            x = Option("c", allowed=("a", "b"), doc="bad default")
