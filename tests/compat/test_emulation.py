"""The torch_npu emulation: installs and restores cleanly, patches nothing unless asked, maps
.npu() and torch.npu onto the real device, names what it does not emulate; and the CLI."""
import logging
import os
import subprocess
import sys
import textwrap
import types

import pytest
import torch

import torchair
from torchair import cli, compat

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PATCHED = [(torch, "npu"), (torch.Tensor, "npu"), (torch.Tensor, "is_npu"),
           (torch.nn.Module, "npu")]


def _assert_clean():
    assert "torch_npu" not in sys.modules and "torch_npu.npu" not in sys.modules
    assert "torch_npu.npu.utils" not in sys.modules
    for owner, name in PATCHED:
        assert name not in vars(owner), f"{owner.__name__}.{name} is still patched"
    assert torch.device is torch._C.device and torch._C._len_torch_function_stack() == 0
    assert not compat.is_emulated()


def _run(code: str, *args: str, cwd=None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, *args] if not code else [sys.executable, "-c", code],
                          capture_output=True, text=True, timeout=120, env=env, cwd=cwd,
                          check=False)


# --- nothing patched without emulate_npu -----------------------------------------------------

def test_importing_torchair_patches_nothing():
    code = textwrap.dedent("""
        import sys, torch, torchair, torchair.compat, torchair.cli
        assert "torch_npu" not in sys.modules, "torch_npu imported"
        assert not hasattr(torch, "npu") and not hasattr(torch.Tensor, "npu")
        assert not hasattr(torch.nn.Module, "npu") and not hasattr(torch.Tensor, "is_npu")
        assert torch.device is torch._C.device, "torch.device replaced"
        assert torch._C._len_torch_function_stack() == 0, "a torch-function mode pushed"
        print("clean")
    """)
    done = _run(code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "clean"


def test_install_then_restore_is_clean():
    _assert_clean()
    emulation = compat.emulate_npu("cpu")
    assert compat.is_emulated() and emulation.emulated and emulation.device == torch.device("cpu")
    import torch_npu
    import torch_npu.npu as npu_ns

    assert torch_npu.npu is npu_ns is torch.npu
    assert torch_npu.__spec__.name == "torch_npu"
    compat.restore()
    _assert_clean()
    with pytest.raises(ImportError):
        import torch_npu
    compat.restore()  # a second restore does nothing
    _assert_clean()


def test_context_manager_restores_also_on_error():
    with pytest.raises(KeyError), compat.emulate_npu("cpu"):
        assert torch.ones(1).npu().is_npu
        raise KeyError("boom")
    _assert_clean()


def test_nested_call_does_not_own_the_patches():
    with compat.emulate_npu("cpu") as outer:
        with compat.emulate_npu() as inner:
            assert inner.device == outer.device
        assert compat.is_emulated()  # the inner exit left the outer emulation in place
    _assert_clean()


def test_emulation_logs_through_the_torchair_logger(torchair_log):
    with compat.emulate_npu("cpu"):
        pass
    messages = [r.getMessage() for r in torchair_log if r.levelno == logging.INFO]
    assert any("torch_npu emulated" in m and "cpu" in m for m in messages), messages
    assert any("emulation removed" in m for m in messages), messages


def test_bad_device_arguments():
    with pytest.raises(ValueError, match="'tpu'"):
        compat.emulate_npu("tpu")
    with pytest.raises(ValueError, match="'meta'"):
        compat.emulate_npu("meta")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="CUDA is not available"):
            compat.emulate_npu("cuda")
    _assert_clean()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA to pick another device")
def test_second_emulation_on_another_device_is_refused():
    with compat.emulate_npu("cpu"), pytest.raises(RuntimeError, match="already installed"):
        compat.emulate_npu("cuda")


# --- the emulated torch_npu --------------------------------------------------------------------

@pytest.fixture
def torch_npu():
    with compat.emulate_npu("cpu"):
        import torch_npu

        yield torch_npu


def test_ops_are_the_op_library_through_torch_ops(torch_npu):
    from torchair.compat._torch_npu import TORCH_NPU_OPS

    assert "npu_quant_matmul" in TORCH_NPU_OPS and "npu_incre_flash_attention" in TORCH_NPU_OPS
    for name in TORCH_NPU_OPS:
        assert name in torchair.ops.__all__, name
        assert getattr(torch_npu, name) is getattr(torch.ops.npu, name), name
    # TorchAir's own ops are torchair.ops only, as on Ascend (torch_npu has no npu_print)
    own = [n for n in torchair.ops.__all__ if n.startswith("npu_") and n not in TORCH_NPU_OPS]
    assert set(own) == {"npu_print", "npu_create_tagged_event", "npu_tagged_event_record",
                        "npu_tagged_event_wait", "npu_record_tagged_stream"}
    for name in own:
        assert not hasattr(torch_npu, name), name
    x, gamma = torch.randn(3, 8), torch.rand(8) + 0.5
    y, _ = torch_npu.npu_rms_norm(x, gamma)
    torch.testing.assert_close(y, x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * gamma)


def test_format_cast_is_the_identity(torch_npu):
    t = torch.randn(4, 8).npu()
    assert torch_npu.npu_format_cast(t, 29) is t  # FRACTAL_NZ does not exist off Ascend
    assert torch_npu.npu_format_cast(t, 2) is t
    assert torch_npu.get_npu_format(t) == 2
    assert torch_npu.npu_format_cast_(t, 29) is t  # vllm-ascend casts MoE weights in place
    assert torch_npu.npu_format_cast_(t, torch.ones(1)) is t and torch_npu.get_npu_format(t) == 2
    for bad in ("29", 29.0, True, None):
        with pytest.raises(TypeError, match="acl_format must be an int"):
            torch_npu.npu_format_cast(t, bad)
    with pytest.raises(TypeError, match="expected a Tensor"):
        torch_npu.npu_format_cast([1, 2], 2)


def test_unemulated_names_raise_naming_them(torch_npu):
    with pytest.raises(NotImplementedError,
                       match=r"torch_npu\.npu_moe_distribute_dispatch is Ascend"):
        _ = torch_npu.npu_moe_distribute_dispatch
    with pytest.raises(compat.NotEmulatedError, match=r"torch_npu\.npu\.NPUGraph is Ascend-only"):
        _ = torch.npu.NPUGraph
    assert not hasattr(torch_npu, "profiler")  # still an AttributeError for feature probes
    assert torch_npu.__path__ == []  # a package: its submodules answer for themselves
    with pytest.raises(ImportError, match="torch_npu.contrib.function is Ascend-only"):
        import torch_npu.contrib.function  # noqa: F401


def test_tensor_and_module_npu(torch_npu):
    t = torch.arange(4.0)
    for arg in ((), (0,), ("npu",), ("npu:0",), (torch.device("cpu"),)):
        moved = t.npu(*arg)
        assert moved.device == torch.device("cpu") and moved.is_npu
        torch.testing.assert_close(moved, t)
    with pytest.raises(ValueError, match="'tpu:0'"):
        t.npu("tpu:0")
    model = torch.nn.Linear(2, 3)
    assert model.npu() is model and model.weight.device == torch.device("cpu")


def test_torch_npu_device_functions(torch_npu):
    npu = torch.npu
    assert npu.is_available() is True
    assert npu.device_count() == 1 and npu.current_device() == 0
    npu.set_device(0)
    npu.set_device("npu:0")
    npu.synchronize()
    npu.empty_cache()
    npu.set_compile_mode(jit_compile=False)
    assert "emulated" in npu.get_device_name(0)
    assert npu.config.allow_internal_format is False
    npu.manual_seed(3)
    a = torch.randn(2)
    npu.manual_seed(3)
    assert torch.equal(a, torch.randn(2))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_is_the_default_npu_when_present():
    with compat.emulate_npu() as emulation:
        assert emulation.device.type == "cuda"
        assert torch.ones(2).npu().is_cuda and torch.nn.Linear(2, 2).npu().weight.is_cuda
        assert torch.npu.device_count() == torch.cuda.device_count()
        assert torch.npu.get_device_name() == torch.cuda.get_device_name()


def test_ops_trace_under_torch_compile(torch_npu):
    config = torchair.CompilerConfig()
    config.debug.run_eagerly = True
    backend = torchair.get_npu_backend(compiler_config=config)

    def fn(x, gamma):
        return torch_npu.npu_rms_norm(torch_npu.npu_format_cast(x, 29), gamma)[0]

    x, gamma = torch.randn(2, 8).npu(), torch.ones(8).npu()
    out = torch.compile(fn, backend=backend, fullgraph=True)(x, gamma)
    torch.testing.assert_close(out, fn(x, gamma))

    def moves(x):  # .npu() and torch.npu inside traced code (Dynamo inlines them)
        return x.npu() + 1 if torch.npu.is_available() and x.is_npu else x

    torch.testing.assert_close(torch.compile(moves, backend=backend, fullgraph=True)(x), x + 1)


# --- the CLI -----------------------------------------------------------------------------------

def test_cli_missing_script_exits_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["run", str(tmp_path / "nope.py")])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "nope.py" in err and "no such file" in err
    with pytest.raises(SystemExit) as exit_:
        cli.main(["frobnicate"])
    assert exit_.value.code == 2
    _assert_clean()


def test_cli_run_sets_argv_path_and_restores(tmp_path, capsys):
    script = tmp_path / "show.py"
    script.write_text(textwrap.dedent("""
        import os, sys, torch, torch_npu
        print("argv", sys.argv[1:])
        print("dir", sys.path[0] == os.path.dirname(os.path.abspath(__file__)))
        print("name", __name__, torch.ones(2).npu().device)
    """))
    argv, path = list(sys.argv), list(sys.path)
    assert cli.main(["run", "--device", "cpu", str(script), "a", "--b", "-c"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == ["argv ['a', '--b', '-c']", "dir True", "name __main__ cpu"]
    assert sys.argv == argv and sys.path == path
    _assert_clean()


def test_cli_script_errors_propagate_and_restore(tmp_path):
    script = tmp_path / "fail.py"
    script.write_text("import torch_npu\ntorch_npu.npu_not_there()\n")
    with pytest.raises(compat.NotEmulatedError, match="torch_npu.npu_not_there"):
        cli.main(["run", str(script)])
    _assert_clean()


def test_cli_demo_forwards_its_arguments(monkeypatch):
    seen = []
    fake = types.ModuleType("torchair.demo")
    fake.main = lambda argv: seen.append(argv) or 3
    monkeypatch.setitem(sys.modules, "torchair.demo", fake)
    monkeypatch.setattr(torchair, "demo", fake, raising=False)
    assert cli.main(["demo", "--steps", "2", "run"]) == 3
    assert seen == [["--steps", "2", "run"]]


def test_python_m_torchair_run(tmp_path):
    script = tmp_path / "tiny.py"
    script.write_text("import torch\nimport torch_npu\nprint(torch.ones(2).npu().device)\n")
    done = _run("", "-m", "torchair", "run", str(script), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ("cuda:0" if torch.cuda.is_available() else "cpu")
    missing = _run("", "-m", "torchair", "run", str(tmp_path / "absent.py"), cwd=tmp_path)
    assert missing.returncode == 2 and "absent.py" in missing.stderr
