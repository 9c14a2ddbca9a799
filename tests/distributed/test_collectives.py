"""Collectives inside compiled graphs: 2 gloo processes (one spawned world runs several checks,
see _world.py), the no-process-group errors in this process, and NCCL + CUDA graph (marked)."""
from __future__ import annotations

import json
import socket
import time
import warnings

import _world  # noqa: E402 - beside this file (pytest puts its folder on sys.path)
import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as fc
import torch.multiprocessing as mp

import torchair

WORLD = 2
HOST = "inside the launch unit (gloo, host)"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _join(ctx, what: str, deadline: float = 120) -> None:
    """Wait for the spawned ranks, at most `deadline` s; a rank that raised fails the test."""
    start = time.monotonic()
    while not ctx.join(timeout=5):  # raises ProcessRaisedException when a rank failed
        if time.monotonic() - start > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail(f"{what} did not finish in {deadline} s")


def _spawn(tmp_path, names, inductor=False) -> list[dict]:
    _join(mp.start_processes(_world.worker, args=(WORLD, _free_port(), str(tmp_path), names,
                                                  inductor),
                             nprocs=WORLD, join=False, start_method="spawn"),
          f"the {WORLD}-process world")
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]
    for rank, result in enumerate(results):
        for name, value in result.items():
            assert "error" not in value, f"rank {rank} {name}:\n{value['error']}"
    return results


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return _spawn(tmp_path_factory.mktemp("world"),
                  ["functional", "inplace", "patch_for_hcom", "tiling_sink", "gears"])


def test_functional_collectives_match_eager_on_every_rank(world):
    for rank in world:
        r = rank["functional"]
        assert r["equal"] and r["graphs"] == 1 and r["build_static"], r
        assert r["collectives"] == ["all_reduce x1, all_gather_into_tensor x1, "
                                    f"reduce_scatter_tensor x1, all_to_all_single x1 {HOST}"]


def test_inplace_collectives_match_eager_on_every_rank(world):
    for rank in world:
        r = rank["inplace"]
        assert r["equal"] and r["graphs"] == 1 and r["build_static"], r
        assert r["collectives"] == ["all_reduce x1, all_gather_into_tensor x1, "
                                    f"reduce_scatter_tensor x1, all_to_all_single x1 {HOST}"]


def test_patch_for_hcom_traces_broadcast_and_all_to_all(world):
    for rank in world:
        r = rank["patch_for_hcom"]
        if "no_alltoall" in r:  # gloo gained all_to_all after torch 2.11: nothing to compare with
            assert torch.torch_version.TorchVersion(torch.__version__) < (2, 13), r
            pytest.skip(f"gloo has no all_to_all in torch {r['no_alltoall']}")
        assert r["unpatched"] != "compiled"  # Dynamo alone cannot trace them
        assert r["idempotent"] and r["restored"], r
        p = r["patched"]
        assert p["equal"] and p["build_static"], p
        assert p["collectives"] == [f"broadcast x1, all_to_all_single x1 {HOST}"]


def test_collective_with_sunk_lengths_is_one_static_unit(world):
    for rank in world:
        r = rank["tiling_sink"]
        assert r["equal"] == [True, True, True] and r["frames"] == 1, r
        assert r["paths"] == [4] and r["build_static"] == [True], r
        assert r["sunk"] == [["L_lens_0_", "L_lens_1_"]], r
        assert r["collectives"] == [f"all_reduce x1 {HOST}"]


def _assert_gears(r, engine):
    assert r["equal"] == [True] * 4 and r["frames"] == 1, r  # one Dynamo trace
    assert r["sizes"] == [[2, 1, 32], [4, 1, 32], [2, 1, 32], [4, 1, 32]], r
    assert r["paths"] == [4] and r["build_static"] == [True] and r["engine"] == [engine], r
    assert r["gears"] == [[["L_x_[0]=2, L_kc_[0]=2, L_vc_[0]=2", True],
                           ["L_x_[0]=4, L_kc_[0]=4, L_vc_[0]=4", True]]], r  # two units built
    assert r["sunk"] == [["L_lens_0_"]], r
    assert r["collectives"] == ["all_reduce x1 inside each gear's launch unit (gloo, host)"], r


def test_gears_with_a_collective_build_one_static_unit_per_gear(world):
    """Issue 19 item 2: gears and tiling sink keep working with an all_reduce in the graph."""
    for rank in world:
        _assert_gears(rank["gears"], "fx")


@pytest.mark.inductor
def test_gears_with_a_collective_through_inductor(tmp_path):
    for rank in _spawn(tmp_path, ["gears"], inductor=True):
        _assert_gears(rank["gears"], "inductor")


@pytest.mark.inductor
def test_inplace_collectives_through_inductor(tmp_path):
    for rank in _spawn(tmp_path, ["inplace"], inductor=True):
        r = rank["inplace"]
        assert r["equal"] and r["build_static"] and r["engine"] == ["inductor"], r


# ------------------------------------------------------------------- no process group (here)

def _fx_backend():
    config = torchair.CompilerConfig()
    config.debug.run_eagerly = True
    return torchair.get_npu_backend(compiler_config=config)


def test_inplace_collective_without_process_group_names_op_and_fix():
    from torchair.distributed import hcom

    assert not dist.is_initialized()

    def f(x):
        dist.all_reduce(x)
        return x + 1

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torchair.patch_for_hcom()
    try:
        with pytest.raises(Exception, match=r"all_reduce in a compiled graph needs a process "
                                            r"group.*init_process_group"):
            torch.compile(f, backend=_fx_backend(), fullgraph=True)(torch.ones(2))
    finally:
        hcom.unpatch_for_hcom()
    assert not hcom.patched_for_hcom()


def test_graph_collective_without_process_group_fails_in_the_backend():
    assert not dist.is_initialized()

    def f(x):
        return fc.all_reduce(x, "sum", "tp_group") + 1  # a group name: traced without a group

    with pytest.raises(Exception, match=r"collective `all_reduce`.*'tp_group'.*does not exist.*"
                                        r"init_process_group"):
        torch.compile(f, backend=_fx_backend(), fullgraph=True)(torch.ones(2))


# ------------------------------------------------------------------- NCCL + CUDA graph

def _nccl_worker(rank: int, world: int, port: int, out_dir: str) -> None:
    import datetime
    import os

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    try:
        model = _world.TiledStep().cuda().eval()
        g = torch.Generator(device="cuda").manual_seed(rank)
        kc = torch.randn(_world.B, _world.S, _world.H, device="cuda", generator=g)
        vc = torch.randn_like(kc)
        config = torchair.CompilerConfig()
        config.experimental_config.tiling_schedule_optimize = True
        step = torch.compile(model, backend=torchair.get_npu_backend(compiler_config=config),
                             dynamic=True, fullgraph=True)
        equal = []
        with torch.no_grad():
            for lens in ([5, 7], [3, 16]):
                x = torch.randn(_world.B, 1, _world.H, device="cuda", generator=g)
                for t in (x, kc, vc):
                    torch._dynamo.mark_static(t)
                equal.append(bool(torch.allclose(step(x, lens, kc, vc), model(x, lens, kc, vc),
                                                 atol=1e-4, rtol=1e-4)))
        report = torchair.graph_reports()[-1]
        result = {"equal": equal, "launch": report.launch, "collectives": report.collectives}
    finally:
        dist.destroy_process_group()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available() or not dist.is_nccl_available(),
                    reason="needs a CUDA GPU and NCCL")
def test_nccl_collective_stays_in_one_cuda_graph(tmp_path):
    world = min(2, torch.cuda.device_count())  # one GPU: a 1-rank NCCL world still captures
    _join(mp.start_processes(_nccl_worker, args=(world, _free_port(), str(tmp_path)),
                             nprocs=world, join=False, start_method="spawn"),
          f"the {world}-rank NCCL world", deadline=300)
    for rank in range(world):
        r = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert r["equal"] == [True, True], r
        assert r["launch"] == "one launch unit: CUDA graph replay", r
        assert r["collectives"] == ("all_reduce x1 inside the launch unit (nccl, captured in "
                                    "the CUDA graph)"), r


# ------------------------------------------------------------------- per-rank cache_compile

def _cache_world(tmp_path, cache_dir, world, warm) -> list[dict]:
    out = tmp_path / f"out_{world}_{warm}"
    out.mkdir()
    _join(mp.start_processes(_world.cache_worker,
                             args=(world, _free_port(), str(out), str(cache_dir), warm),
                             nprocs=world, join=False, start_method="spawn"),
          "the cache_compile world")
    results = [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]
    for rank, r in enumerate(results):
        assert "error" not in r, f"rank {rank}:\n{r['error']}"
    return results


def test_cache_compile_warm_starts_each_rank_from_its_own_directory(tmp_path):
    import pathlib

    cache = tmp_path / "cache"
    cold = _cache_world(tmp_path, cache, 2, warm=False)
    assert all(r["equal"] and r["dynamo_graphs"] == 1 and r["drain_registered"]
               for r in cold), cold
    ranks = sorted(p.parent.parent.name for p in pathlib.Path(cache).rglob("meta.json"))
    assert ranks == ["world2global_rank0", "world2global_rank1"]
    warm = _cache_world(tmp_path, cache, 2, warm=True)  # Dynamo refuses: the entries serve
    # the loaded entry's collective registered the exit drain (no compile ran)
    assert all(r["equal"] and r["dynamo_graphs"] == 0 and r["drain_registered"]
               for r in warm), warm
    # another world size never loads a 2-rank entry: it compiles its own
    (single,) = _cache_world(tmp_path, cache, 1, warm=False)
    assert single["equal"] and single["dynamo_graphs"] == 1, single
    ranks = sorted(p.parent.parent.name for p in pathlib.Path(cache).rglob("meta.json"))
    assert ranks == ["world1global_rank0", "world2global_rank0", "world2global_rank1"]
