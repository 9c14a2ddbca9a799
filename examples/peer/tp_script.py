"""A tensor-parallel MLP written for Ascend (torch_npu + HCCL), run unchanged with

    torchair run --nproc-per-node 2 examples/peer/tp_script.py

Each rank holds a column shard of the first weight and a row shard of the second (Megatron
style): the hidden activations are gathered with ``all_gather_into_tensor`` for a check, the
partial outputs are summed with ``all_reduce``. The same layer is then compiled with torchair
(``torchair.patch_for_hcom()``, the in-place ``all_reduce`` inside the graph; FX engine, or
Inductor with ``TP_ENGINE=inductor``). Every rank prints one line ``rank R/W: ...`` and checks
both results against the full (unsharded) MLP computed locally.
"""
import os

import torch
import torch.distributed as dist
import torch_npu  # noqa: F401  (Ascend scripts import it; torchair run emulates it)

import torchair


def tp_mlp(x, w1_local, w2_local):
    """The tensor-parallel MLP as one compiled graph: column-parallel, then row-parallel with the
    in-place all_reduce that patch_for_hcom makes traceable."""
    y = torch.relu(x @ w1_local) @ w2_local
    dist.all_reduce(y)
    return y


def main() -> None:
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.npu.set_device(local_rank)
    dist.init_process_group(backend="hccl")
    rank, world = dist.get_rank(), dist.get_world_size()

    # the same full weights on every rank (same seed), then each rank keeps its shard
    torch.manual_seed(0)
    hidden, inner, tokens = 8, 4 * world, 3
    w1 = torch.randn(hidden, inner, device="npu")
    w2 = torch.randn(inner, hidden, device="npu")
    x = torch.randn(tokens, hidden, device="npu")
    shard = inner // world
    w1_local = w1[:, rank * shard:(rank + 1) * shard].contiguous()
    w2_local = w2[rank * shard:(rank + 1) * shard, :].contiguous()

    h_local = torch.relu(x @ w1_local)                          # column parallel
    h_all = torch.empty(world * tokens, shard, device="npu")
    dist.all_gather_into_tensor(h_all, h_local)
    h_full = torch.cat(h_all.chunk(world), dim=1)               # [tokens, inner]
    y = h_local @ w2_local                                      # row parallel: partial sums
    dist.all_reduce(y)

    # the other collectives TP code uses
    flat = torch.arange(world * 2, dtype=torch.float32, device="npu") * (rank + 1)
    part = torch.empty(2, device="npu")
    dist.reduce_scatter_tensor(part, flat)
    swapped = torch.empty(world, device="npu")
    dist.all_to_all_single(swapped, torch.full((world,), float(rank), device="npu"))
    token = torch.tensor([rank * 10.0], device="npu")
    dist.broadcast(token, src=0)
    dist.barrier()

    # the same layer compiled by torchair (the collective runs inside the graph)
    torchair.patch_for_hcom()
    config = torchair.CompilerConfig()
    config.debug.run_eagerly = os.environ.get("TP_ENGINE", "fx") == "fx"  # fx: fast to compile
    compiled = torch.compile(tp_mlp, backend=torchair.get_npu_backend(compiler_config=config),
                             fullgraph=True)
    y_compiled = compiled(x, w1_local, w2_local)

    reference = torch.relu(x @ w1) @ w2
    compiled_ok = torch.allclose(y_compiled, reference, atol=1e-4)
    ok = (torch.allclose(y, reference, atol=1e-4) and torch.allclose(h_full, torch.relu(x @ w1))
          and part.tolist() == [float(2 * rank + i) * world * (world + 1) / 2 for i in range(2)]
          and swapped.tolist() == [float(r) for r in range(world)] and token.item() == 0.0)
    print(f"rank {rank}/{world}: npu={torch.npu.current_device()} device={y.device.type} "
          f"sum={y.sum().item():.4f} matches_full={ok} compiled_matches={compiled_ok}\n", end="",
          flush=True)  # one write
    dist.destroy_process_group()
    if not (ok and compiled_ok):
        raise SystemExit(f"rank {rank}: tensor-parallel result differs from the full MLP")


if __name__ == "__main__":
    main()
