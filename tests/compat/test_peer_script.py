"""An unmodified Ascend-style script (examples/peer/npu_script.py) under ``torchair run`` saves
the same results as its CPU twin (examples/peer/cpu_script.py).

The script uses what TorchAir's docs and tests use: ``import torch_npu``, "npu:0" devices,
``.npu()``, a ``torch.npu.Stream`` with ``torch.npu.stream``, timing events, seeds, Ascend
switches and a ``CompilerConfig`` with ``torch.compile(..., fullgraph=True)``.
"""
import os
import runpy
import subprocess
import sys

import pytest
import torch

from torchair import cli

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NPU_SCRIPT = os.path.join(ROOT, "examples", "peer", "npu_script.py")
CPU_SCRIPT = os.path.join(ROOT, "examples", "peer", "cpu_script.py")
KEYS = ["elapsed_ms_nonnegative", "matches_eager", "noise", "normed", "out"]


@pytest.fixture
def twin(tmp_path, monkeypatch):
    """The CPU twin's results, run in this process without the emulation."""
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "cpu.pt"
    monkeypatch.setattr(sys, "argv", [CPU_SCRIPT, str(out)])
    runpy.run_path(CPU_SCRIPT, run_name="__main__")
    assert "torch_npu" not in sys.modules
    return torch.load(out)


def _assert_same(npu: dict, cpu: dict, exact: bool) -> None:
    assert sorted(npu) == sorted(cpu) == KEYS
    assert npu["matches_eager"] is True and npu["elapsed_ms_nonnegative"] is True
    for key in ("out", "normed"):
        assert npu[key].device.type == "cpu"
        if exact:
            assert torch.equal(npu[key], cpu[key]), key
        else:  # CUDA kernels round differently
            torch.testing.assert_close(npu[key], cpu[key], rtol=1e-3, atol=1e-3)
    if exact:  # the NPU generator is the CPU one; on CUDA it is CUDA's, other numbers
        assert torch.equal(npu["noise"], cpu["noise"])


def test_torchair_run_subprocess_matches_the_cpu_twin(tmp_path, twin):
    out = tmp_path / "npu.pt"
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-m", "torchair", "run", NPU_SCRIPT, str(out)],
                          capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "saved" in done.stdout
    _assert_same(torch.load(out), twin, exact=not torch.cuda.is_available())
    dumps = [f for f in os.listdir(tmp_path) if f.endswith(".py") and "pid_" in f]
    assert dumps, "config.debug.graph_dump.type = 'py' wrote no graph dump"


def test_cli_main_in_process_matches_the_cpu_twin(tmp_path, twin, capsys):
    out = tmp_path / "npu_inproc.pt"
    assert cli.main(["run", "--device", "cpu", NPU_SCRIPT, str(out)]) == 0
    assert "saved" in capsys.readouterr().out
    _assert_same(torch.load(out), twin, exact=True)
    assert "torch_npu" not in sys.modules and torch.device is torch._C.device
    assert torch._C._len_torch_function_stack() == 0


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cli_main_on_cuda_matches_the_cpu_twin(tmp_path, twin):
    out = tmp_path / "npu_cuda.pt"
    assert cli.main(["run", "--device", "cuda", NPU_SCRIPT, str(out)]) == 0
    _assert_same(torch.load(out), twin, exact=False)
