"""Seams of the emulation an adversarial probe found (issue 33): integer device indices,
threads and child processes, ``torch_npu`` submodule imports (``transfer_to_npu``), and a
world size or rank that contradicts the launcher's."""
import os
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
import torch.distributed as dist

import torchair
from torchair import compat
from torchair.compat import _distributed

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CPU = torch.device("cpu")


def _env(**extra):
    return dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
                **extra)


# --- 1. an integer device is the NPU of that index --------------------------------------------

def test_integer_devices_are_the_npu():
    with compat.emulate_npu("cpu"):
        x = torch.ones(2)
        assert torch.zeros(2, device=0).device == CPU
        assert x.to(0).device == CPU and x.to(device=0).device == CPU
        assert x.to(0, torch.float16).dtype == torch.float16  # device then dtype
        assert x.to(0, non_blocking=True).device == CPU
        assert torch.device(0) == CPU
        assert torch.nn.Linear(2, 2).to(0).weight.device == CPU
        assert torch.nn.Linear(2, 2).to(device=0).weight.device == CPU
        assert torch.as_tensor([1.0], device=0).device == CPU
        assert x.new_zeros(3, device=0).device == CPU
        assert x.npu(0).device == CPU
        # ints that are not devices stay what they are
        assert torch.zeros(2).shape == (2,) and torch.as_tensor(3).item() == 3
        assert x.to(torch.float16, True).dtype == torch.float16
        assert torch.full((2,), 0).tolist() == [0, 0]
        with pytest.raises(RuntimeError):  # a negative index is still torch's error
            torch.zeros(2, device=-1)


def test_integer_devices_compiled():
    def f(x):
        return x.to(0) + torch.ones(2, device=0)

    config = torchair.CompilerConfig()
    config.debug.run_eagerly = True
    with compat.emulate_npu("cpu"):
        for backend in ("eager", torchair.get_npu_backend(compiler_config=config)):
            torch._dynamo.reset()
            out = torch.compile(f, backend=backend, fullgraph=True)(torch.ones(2))
            assert out.device == CPU and out.tolist() == [2.0, 2.0]
    torch._dynamo.reset()


# --- 2. threads and child processes -----------------------------------------------------------

def test_threads_started_by_the_script_get_the_emulation():
    original = threading.Thread._bootstrap_inner
    seen = {}

    def work(key):
        seen[key] = torch.zeros(1, device="npu:0").device
        return torch.ones(1).to(0).device

    with compat.emulate_npu("cpu"):
        thread = threading.Thread(target=work, args=("thread",))
        thread.start()
        thread.join(30)
        with ThreadPoolExecutor(2) as pool:
            assert pool.submit(work, "pool").result(timeout=30) == CPU
    assert seen == {"thread": CPU, "pool": CPU}
    assert threading.Thread._bootstrap_inner is original  # restore() put it back
    errors = []
    thread = threading.Thread(target=lambda: errors.append(
        pytest.raises(RuntimeError, torch.zeros, 1, device="npu")))
    thread.start()
    thread.join(30)
    assert len(errors) == 1  # no emulation after restore: torch's own "npu" error


def test_child_environment_is_set_and_restored(monkeypatch):
    from torchair.compat import _children
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    monkeypatch.delenv(_children.DEVICE_ENV, raising=False)
    path = list(sys.path)
    with compat.emulate_npu("cpu"):
        assert sys.path[1] == _children.SHIM_DIR  # spawn / forkserver children copy sys.path
        assert os.environ["PYTHONPATH"] == _children.SHIM_DIR + os.pathsep + "/elsewhere"
        assert os.environ[_children.DEVICE_ENV] == "cpu"
    assert sys.path == path and os.environ["PYTHONPATH"] == "/elsewhere"
    assert _children.DEVICE_ENV not in os.environ


def test_spawned_children_get_the_emulation(tmp_path):
    script = tmp_path / "spawner.py"
    script.write_text(textwrap.dedent("""\
        import subprocess, sys
        import torch, torch_npu
        import torch.multiprocessing as tmp

        def work(rank, queue):
            queue.put(f"spawn {torch.zeros(1, device='npu').device} {torch.ones(1).to(0).device}")

        if __name__ == "__main__":
            queue = tmp.get_context("spawn").SimpleQueue()
            tmp.spawn(work, args=(queue,), nprocs=1, join=True)
            print(queue.get())
            code = "import torch, torch_npu; print('python', torch.ones(1, device='npu:0').device)"
            print(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                 timeout=60, check=True).stdout.strip())
        """))
    done = subprocess.run([sys.executable, "-m", "torchair", "run", "--device", "cpu",
                           str(script)], capture_output=True, text=True, timeout=120,
                          env=_env(), cwd=tmp_path, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("\n")[:2] == ["spawn cpu cpu", "python cpu"], done.stdout


# --- 3. torch_npu submodules --------------------------------------------------------------------

def test_torch_npu_is_a_package_whose_other_submodules_say_they_are_not_emulated():
    with compat.emulate_npu("cpu"):
        import torch_npu
        import torch_npu.distributed
        import torch_npu.npu.utils  # noqa: F401
        assert torch_npu.__path__ == [] and torch_npu.__spec__.submodule_search_locations == []
        for name in ("torch_npu.npu.amp", "torch_npu.profiler", "torch_npu.contrib.function",
                     "torch_npu.distributed.rpc"):
            with pytest.raises(ModuleNotFoundError, match=f"{name} is Ascend-only and not "
                               "emulated by torchair run") as err:
                __import__(name)
            assert err.value.name == name
        from torch_npu import contrib
        with pytest.raises(compat.NotEmulatedError, match="torch_npu.contrib.module"):
            contrib.module  # noqa: B018
    assert not any(k.startswith("torch_npu") for k in sys.modules)
    assert not any(type(f).__name__ == "TorchNpuFinder" for f in sys.meta_path)


def test_transfer_to_npu_on_cpu_makes_cuda_the_npu():
    before = {name: getattr(torch.cuda, name) for name in ("is_available", "device_count",
                                                          "synchronize", "Stream")}
    cuda_methods = (torch.Tensor.cuda, torch.nn.Module.cuda)
    with compat.emulate_npu("cpu"):
        from torch_npu.contrib import transfer_to_npu  # noqa: F401
        assert torch.cuda.is_available() and torch.cuda.device_count() == 1
        torch.cuda.set_device(0)
        torch.cuda.synchronize()
        assert torch.cuda.current_device() == 0
        x = torch.ones(2)
        assert torch.zeros(2, device="cuda").device == CPU
        assert torch.zeros(2, device="cuda:1").device == CPU
        assert x.cuda().device == CPU and x.cuda(0).device == CPU
        assert x.to("cuda:0").device == CPU and x.to(torch.device("cuda", 0)).device == CPU
        assert torch.device("cuda") == CPU
        assert torch.nn.Linear(2, 2).cuda().weight.device == CPU
        assert torch.nn.Linear(2, 2).to("cuda").weight.device == CPU
        with torch.cuda.stream(torch.cuda.Stream()):
            pass
        torch.manual_seed(0)  # calls torch.cuda.manual_seed_all: still torch's own
        assert _distributed.map_backend("nccl", CPU, True) == "gloo"
        assert _distributed.map_backend("cpu:gloo,cuda:nccl", CPU, True) == "cpu:gloo"

        def f(x):
            return x.to("cuda") + torch.ones(2, device="cuda")
        torch._dynamo.reset()
        assert torch.compile(f, backend="eager", fullgraph=True)(x).device == CPU
        torch._dynamo.reset()
    assert {name: getattr(torch.cuda, name) for name in before} == before
    assert (torch.Tensor.cuda, torch.nn.Module.cuda) == cuda_methods
    assert not torch.cuda.is_available()
    assert torch.device("cuda").type == "cuda"


@pytest.mark.cuda
def test_transfer_to_npu_on_cuda_changes_nothing():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    is_available = torch.cuda.is_available
    with compat.emulate_npu("cuda"):
        from torch_npu.contrib import transfer_to_npu  # noqa: F401
        assert torch.cuda.is_available is is_available
        assert torch.ones(1).cuda().device.type == "cuda"
        assert torch.ones(1).to(0).device == torch.device("cuda", 0)


# --- 4. a world size or rank that contradicts the launcher -----------------------------------

@pytest.mark.parametrize("kwargs, match", [
    ({"world_size": 3, "rank": 0}, r"\$WORLD_SIZE=2 .*world_size=3"),
    ({"rank": 2}, r"rank=2, outside 0\.\.1"),
    ({"rank": 0}, r"rank=0 while the launcher started this process as \$RANK=1"),
])
def test_launcher_mismatch_fails_at_once(monkeypatch, kwargs, match):
    monkeypatch.setattr(dist.distributed_c10d, "init_process_group",
                        lambda *a, **k: pytest.fail("reached torch's rendezvous"))
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with compat.emulate_npu("cpu"):
        with pytest.raises(RuntimeError, match=match):
            dist.init_process_group("hccl", **kwargs)


def test_launcher_mismatch_with_two_gloo_ranks(tmp_path):
    script = tmp_path / "mismatch.py"
    script.write_text(textwrap.dedent("""\
        import os
        import torch, torch.distributed as dist, torch_npu
        rank = int(os.environ["RANK"])
        for kwargs in ({"world_size": 3, "rank": rank}, {"rank": 1 - rank}):
            try:
                dist.init_process_group("hccl", **kwargs)
            except RuntimeError as err:
                print(f"rank {rank}: {err}", flush=True)
        dist.init_process_group("hccl", world_size=2, rank=rank)
        x = torch.ones(2, device=rank)
        dist.all_reduce(x)
        print(f"rank {rank}: sum {x.tolist()}", flush=True)
        dist.destroy_process_group()
        """))
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "torchair", "run", "--nproc-per-node", "2",
                           "--device", "cpu", str(script)], capture_output=True, text=True,
                          timeout=120, env=_env(TORCHAIR_DIST_TIMEOUT="60"), cwd=tmp_path,
                          check=False)
    elapsed = time.monotonic() - start
    assert done.returncode == 0, done.stderr[-3000:]
    for rank in (0, 1):
        assert f"rank {rank}: sum [2.0, 2.0]" in done.stdout, done.stdout
        assert (f"rank {rank}: torch.distributed.init_process_group: this process was started "
                "as one of $WORLD_SIZE=2 ranks") in done.stdout
        assert "passes world_size=3" in done.stdout
        assert f"passes rank={1 - rank} while the launcher started this process as $RANK={rank}" \
            in done.stdout
    assert elapsed < 45, elapsed  # far below the 60 s rendezvous timeout
