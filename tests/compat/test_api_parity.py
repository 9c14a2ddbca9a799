"""TorchAir's public API (issue 17, item 2): every name of torchair.base.parity.PUBLIC_API resolves
(or, when "not supported", raises AttributeError with its reason), TorchAir's module paths are
the same objects, backend="torchair" compiles, the layout helpers check their arguments, and
importing torchair stays light."""
import json
import logging
import subprocess
import sys

import pytest
import torch

import torchair
from torchair.base import parity as _parity

# TorchAir's torchair.__all__ (newest version) and the public names of its submodules
PEER_TOP_LEVEL = ["get_compiler", "get_npu_backend", "dynamo_export", "CompilerConfig",
                  "use_internal_format_weight", "logger", "register_fx_node_ge_converter",
                  "patch_for_hcom", "register_replacement", "npu_format_cast_via_cpu"]
PEER_SUBMODULE_NAMES = [
    "torchair.ops.npu_fused_infer_attention_score",
    "torchair.ops.npu_fused_infer_attention_score_v2",
    "torchair.ops.npu_print", "torchair.ops.npu_create_tagged_event",
    "torchair.ops.npu_tagged_event_record", "torchair.ops.npu_tagged_event_wait",
    "torchair.ops.npu_record_tagged_stream", "torchair.ops.record", "torchair.ops.wait",
    "torchair.scope.npu_stream_switch", "torchair.scope.npu_wait_tensor",
    "torchair.scope.super_kernel", "torchair.scope.limit_core_num",
    "torchair.scope.op_never_timeout", "torchair.scope.data_dump",
    "torchair.npu_fx_compiler.get_npu_backend", "torchair.npu_fx_compiler.get_compiler",
    "torchair.npu_export.dynamo_export",
    "torchair.patterns.pattern_pass_manager.register_replacement",
    "torchair.inference.cache_compile", "torchair.inference.readable_cache",
    "torchair.inference.set_dim_gears",
    "torchair.experimental.inference.use_internal_format_weight",
    "torchair.experimental.inference.npu_format_cast_via_cpu",
    "torchair.llm_datadist.create_npu_tensors", "torchair.ge.custom_op"]


def test_registry_lists_the_peer_surface():
    for name in PEER_TOP_LEVEL:
        assert f"torchair.{name}" in _parity.PUBLIC_API, name
    for name in PEER_SUBMODULE_NAMES + ["torch.compile(backend='torchair')"]:
        assert name in _parity.PUBLIC_API, name
    for name, (status, note) in _parity.PUBLIC_API.items():
        assert status in _parity.STATUSES and note, name


@pytest.mark.parametrize("name", [n for n, (s, _) in _parity.PUBLIC_API.items()
                                  if s != _parity.NOT_SUPPORTED])
def test_every_listed_name_resolves(name):
    obj = _parity.resolve(name)
    assert obj is not None
    if not name.startswith("torch.compile(") and name.count(".") >= 1:
        module, _, attr = name.rpartition(".")
        assert getattr(_parity.resolve(module) if module in _parity.PUBLIC_API
                       else __import__(module, fromlist=[attr]), attr) is obj


def test_unsupported_names_say_why():
    unsupported = [n for n, (s, _) in _parity.PUBLIC_API.items() if s == _parity.NOT_SUPPORTED]
    assert "torchair.dynamo_export" not in unsupported and "torchair.ge.Tensor" in unsupported
    with pytest.raises(AttributeError, match="torchair.llm_datadist is not supported"):
        torchair.llm_datadist
    with pytest.raises(AttributeError, match="npu_tagged_event_reset is not supported"):
        torchair.ops.npu_tagged_event_reset
    with pytest.raises(LookupError, match="not supported"):
        _parity.resolve("torchair.ge")
    with pytest.raises(AttributeError, match="has no attribute 'nothing_here'"):
        torchair.nothing_here


def test_npu_stream_switch_signature_is_torchairs():
    """torchair_public_bindings_st.py compares public signatures with TorchAir's: its
    npu_stream_switch is (stream_tag: str, stream_priority: int = 0, enable_inner_parallel: bool
    = True)."""
    import inspect

    params = inspect.signature(torchair.scope.npu_stream_switch).parameters
    assert [(p.name, p.default) for p in params.values()] == [
        ("stream_tag", inspect.Parameter.empty), ("stream_priority", 0),
        ("enable_inner_parallel", True)]
    assert torchair.scope.npu_stream_switch("s").enable_inner_parallel is True


def test_peer_module_paths_are_the_same_objects():
    import torchair.experimental.inference as exp_inference
    import torchair.npu_fx_compiler as fx_compiler
    from torchair.patterns.pattern_pass_manager import register_replacement

    assert fx_compiler.get_npu_backend is torchair.get_npu_backend
    assert fx_compiler.get_compiler is torchair.get_compiler
    assert register_replacement is torchair.register_replacement
    assert torchair.use_internal_format_weight is exp_inference.use_internal_format_weight
    assert torchair.npu_format_cast_via_cpu is exp_inference.npu_format_cast_via_cpu
    assert torchair.experimental.inference is exp_inference
    assert torchair.compat.emulate_npu is not None
    assert torchair.logger is torchair.core.utils.logger
    import torchair.npu_export as npu_export

    assert npu_export.dynamo_export is torchair.dynamo_export is torchair.export.dynamo_export
    assert torchair.ops.NpuStreamSwitch is torchair.scope.npu_stream_switch
    assert torchair.ops.SuperKernelScope is torchair.scope.super_kernel
    assert torchair.ops.npu_wait_tensor is torchair.scope.npu_wait_tensor
    for name in torchair.ops.__all__:  # every npu_* public name is also an npu op
        if name.startswith("npu_"):
            assert hasattr(torch.ops.npu, name), name


def test_backend_by_name_and_peer_style_backend():
    def fn(x):
        return torch.nn.functional.silu(x) * 2

    x = torch.randn(4, 8)
    out = torch.compile(fn, backend="torchair", options={"debug.run_eagerly": True})(x)
    torch.testing.assert_close(out, fn(x))
    assert torchair.graph_reports()[-1].engine == "fx"
    config = torchair.CompilerConfig()
    config.debug.run_eagerly = True
    backend = torchair.npu_fx_compiler.get_npu_backend(compiler_config=config)
    torch.testing.assert_close(torch.compile(fn, backend=backend)(x), fn(x))
    with pytest.raises(Exception, match="Option .mode. allows"):
        torch.compile(fn, backend="torchair", mode="turbo")(torch.randn(3))


def test_use_internal_format_weight_and_format_cast():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Conv2d(2, 2, 1).half(),
                                torch.nn.ReLU())
    before = {k: (v.clone(), v.data_ptr()) for k, v in model.state_dict().items()}
    assert torchair.use_internal_format_weight(model) is None
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k][0]) and v.data_ptr() == before[k][1], k
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        torchair.use_internal_format_weight({"weight": torch.ones(1)})

    t = torch.randn(3, 4)
    assert torchair.npu_format_cast_via_cpu(t, 29) is t
    strided = torch.randn(4, 3).t()
    cast = torchair.npu_format_cast_via_cpu(strided, 2, customize_dtype=1, input_dtype=1)
    assert cast.is_contiguous() and torch.equal(cast, strided)
    with pytest.raises(TypeError, match="self must be a torch.Tensor"):
        torchair.npu_format_cast_via_cpu([1.0], 29)
    with pytest.raises(TypeError, match="acl_format must be an int"):
        torchair.npu_format_cast_via_cpu(t, "29")
    with pytest.raises(TypeError, match="customize_dtype must be an int or None"):
        torchair.npu_format_cast_via_cpu(t, 29, customize_dtype=1.5)


def test_patch_for_hcom_and_ge_converter_registration():
    with pytest.warns(UserWarning, match="no need to call patch_for_hcom anymore"):
        assert torchair.patch_for_hcom() is None

    def converter(x, meta_outputs=None):
        return x

    decorate = torchair.register_fx_node_ge_converter(torch.ops.aten.add.Tensor)
    assert decorate(converter) is converter
    assert torchair.register_fx_node_ge_converter(None)(converter) is converter
    with pytest.raises(TypeError, match="aten_op must be a torch op"):
        torchair.register_fx_node_ge_converter("aten.add")


def test_event_level_and_hcom_allreduce_module_path(caplog):
    from torchair.core.utils import EVENT_LEVEL, logger

    assert EVENT_LEVEL == 35 and logging.getLevelName(EVENT_LEVEL) == "EVENT"
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger.addHandler(handler)
    try:
        logger.event("step %d done", 3)
        logger.warning_once("said once")
        logger.warning_once("said once")
    finally:
        logger.removeHandler(handler)
    assert [(r.levelno, r.getMessage()) for r in records] == [(EVENT_LEVEL, "step 3 done"),
                                                             (logging.WARNING, "said once")]
    assert type(logging.getLogger("not_torchair")) is logging.Logger  # nothing else patched
    # a fresh process: the TorchAir import path patches the collectives as patch_for_hcom does
    code = ("import torchair.ge_concrete_graph.ge_converter.experimental.patch_for_hcom_allreduce"
            "\nfrom torchair.distributed import patched_for_hcom; print(patched_for_hcom())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "True", out.stderr[-2000:]


def test_import_is_light_and_patches_nothing():
    code = ("import sys, torch; before = torch.compile; import torchair\n"
            "import json; print(json.dumps({'compiler': 'torchair.core.backend' in sys.modules,"
            " 'dynamo': 'torch._dynamo' in sys.modules, 'compat': 'torchair.compat' in "
            "sys.modules, 'npu': hasattr(torch, 'npu'), 'same': torch.compile is before}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert json.loads(out.strip().splitlines()[-1]) == {
        "compiler": False, "dynamo": False, "compat": False, "npu": False, "same": True}
