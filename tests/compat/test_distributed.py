"""torch.distributed under the emulation: HCCL played by gloo, bounded timeouts, the launcher
hint, ``torch.npu.set_device(local_rank)`` on CPU, ``torch_npu.distributed``, and ``restore()``
putting everything back. One process, world size 1 (multi-rank runs: tests/distributed/)."""
import datetime
import sys

import pytest
import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from torchair import compat
from torchair.compat import _distributed
from torchair.compat._distributed import default_timeout, map_backend

CPU = torch.device("cpu")


@pytest.mark.parametrize("backend, cpu, cuda", [
    ("hccl", "gloo", "nccl"),
    ("HCCL", "gloo", "nccl"),
    ("cpu:gloo,npu:hccl", "cpu:gloo", "cpu:gloo,cuda:nccl"),
    ("npu:hccl", "cpu:gloo", "cuda:nccl"),
    ("gloo", "gloo", "gloo"),
    (None, None, None),
])
def test_map_backend(backend, cpu, cuda):
    assert map_backend(backend, CPU) == cpu
    assert map_backend(backend, torch.device("cuda")) == cuda


@pytest.mark.parametrize("bad", ["hccl2", "cpu:gloo,hccl"])
def test_map_backend_rejects_what_it_cannot_read(bad):
    with pytest.raises(ValueError, match="backend="):
        map_backend(bad, CPU)


def test_default_timeout(monkeypatch):
    monkeypatch.delenv("TORCHAIR_DIST_TIMEOUT", raising=False)
    assert default_timeout() == datetime.timedelta(seconds=300)
    monkeypatch.setenv("TORCHAIR_DIST_TIMEOUT", "7.5")
    assert default_timeout() == datetime.timedelta(seconds=7.5)
    monkeypatch.setenv("TORCHAIR_DIST_TIMEOUT", "0")
    with pytest.raises(ValueError, match="TORCHAIR_DIST_TIMEOUT='0'"):
        default_timeout()


def test_restore_puts_torch_distributed_back():
    before = {(mod, name): getattr(mod, name) for mod in (dist, c10d)
              for name in ("init_process_group", "new_group")}
    emulation = compat.emulate_npu("cpu")
    assert dist.init_process_group is not before[(dist, "init_process_group")]
    assert c10d.new_group is not before[(c10d, "new_group")]
    import torch_npu.distributed as npu_dist
    assert npu_dist.all_reduce is dist.all_reduce
    emulation.restore()
    for (mod, name), value in before.items():
        assert getattr(mod, name) is value, f"{mod.__name__}.{name} not restored"
    assert "torch_npu.distributed" not in sys.modules


def test_hccl_maps_to_gloo_with_a_bounded_timeout(monkeypatch, torchair_log):
    calls = []
    monkeypatch.setattr(_distributed, "_logged", set())
    monkeypatch.setattr(c10d, "init_process_group", lambda *a, **k: calls.append((a, k)))
    monkeypatch.setenv("TORCHAIR_DIST_TIMEOUT", "42")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    with compat.emulate_npu("cpu"):
        dist.init_process_group("hccl", device_id=torch.device("npu", 1))
        dist.init_process_group(backend="hccl", timeout=datetime.timedelta(seconds=3))
    (args0, kwargs0), (args1, _) = calls
    assert args0[0] == "gloo" and args0[2] == datetime.timedelta(seconds=42)
    assert kwargs0["device_id"] is None
    assert args1[0] == "gloo" and args1[2] == datetime.timedelta(seconds=3)
    mapped = [r for r in torchair_log if "'hccl'" in r.getMessage()]
    assert len(mapped) == 1 and mapped[0].levelname == "INFO"  # once, not per call


def test_without_launcher_env_the_error_names_nproc_per_node(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with compat.emulate_npu("cpu"):
        with pytest.raises(RuntimeError, match="--nproc-per-node"):
            dist.init_process_group("hccl")
    assert not dist.is_initialized()


def test_collectives_on_npu_tensors_world_of_one(tmp_path):
    with compat.emulate_npu("cpu"):
        import torch_npu
        torch.npu.set_device(3)  # any local rank is accepted on CPU, and remembered
        assert torch.npu.current_device() == 3
        store = dist.FileStore(str(tmp_path / "store"), 1)
        dist.init_process_group("hccl", store=store, rank=0, world_size=1)
        try:
            assert dist.get_backend() == "gloo"
            group = torch_npu.distributed.new_group([0], backend="hccl")
            x = torch.arange(4.0, device="npu:3")
            assert x.device.type == "cpu"
            dist.all_reduce(x, group=group)
            out = torch.empty(4, device="npu")
            dist.all_gather_into_tensor(out, x)
            dist.reduce_scatter_tensor(out, x.clone())
            dist.all_to_all_single(out, x.clone())
            dist.broadcast(x, src=0)
            dist.barrier()
            assert out.tolist() == [0.0, 1.0, 2.0, 3.0]
        finally:
            dist.destroy_process_group()


def test_torch_npu_distributed_names_what_is_not_emulated():
    with compat.emulate_npu("cpu"):
        import torch_npu
        assert torch_npu.distributed.is_available() is dist.is_available()
        assert torch_npu.distributed.ReduceOp is dist.ReduceOp
        with pytest.raises(compat.NotEmulatedError, match="is_hccl_feature_supported"):
            torch_npu.distributed.is_hccl_feature_supported()
        assert not hasattr(torch_npu.distributed, "reinit_process_group")
