"""Each rank of a 2-process gloo world exports AllReduceModel with dynamo_export (dynamic, the
weights beside the shared library), then loads its own package with load_export and compares it
with eager at the example size and at another one (spawned by test_dynamo_export.py)."""
from __future__ import annotations

import datetime
import json
import os
import sys
import traceback


def worker(rank: int, world: int, port: int, export_path: str, out_dir: str) -> None:
    result: dict = {}
    try:
        import torch
        import torch.distributed as dist
        from _export_models import AllReduceModel

        import torchair
        from torchair.export import _export

        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world, timeout=datetime.timedelta(seconds=120))
        model = AllReduceModel()
        _export.EXTERNAL_WEIGHTS_BYTES = 0  # as TorchAir's test shrinks its limit
        x, y = torch.ones(4, 2) * (rank + 1), torch.full((4, 2), 0.5)
        result["path"] = torchair.npu_export.dynamo_export(x, y, model=model,
                                                           export_path=export_path, dynamic=True)
        result["inductor_dir"] = _export.rank_inductor_dir(rank)  # where this rank compiled
        loaded = torchair.load_export(export_path)  # this rank's package
        result["weights"] = loaded.spec["weights"]
        result["equal"], result["out"] = [], []
        for n in (4, 3):  # the example size, then another one
            x, y = torch.ones(n, 2) * (rank + 1), torch.full((n, 2), 0.5)
            out = loaded(x, y)
            # eager's result without eager's all_reduce: on gloo, an eager collective on the
            # package's process group between two package calls can pair with the package's
            # own (the next call then times out in gloo's recv; docs/export.md)
            result["equal"].append(bool(torch.allclose(out, model.expected(n, world))))
            result["out"].append(out.tolist())
        # what docs/export.md advises: eager collectives on a group of their own, interleaved
        # with package calls, several times
        other = dist.new_group(list(range(world)))
        result["own_group"] = []
        for n in (4, 3, 4, 3, 5):
            x, y = torch.ones(n, 2) * (rank + 1), torch.full((n, 2), 0.5)
            out = loaded(x, y)
            total = torch.full((1,), float(rank + 1))
            dist.all_reduce(total, group=other)
            result["own_group"].append(bool(torch.allclose(out, model.expected(n, world)))
                                       and total.item() == world * (world + 1) / 2)
        for name, args in (("range_error", (torch.ones(1, 2), torch.ones(1, 2))),
                           ("equal_error", (torch.ones(3, 2), torch.ones(4, 2)))):
            try:  # rejected before the package runs (no collective is started)
                loaded(*args)
                result[name] = None
            except ValueError as exc:
                result[name] = str(exc)
        dist.barrier()
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - reported to the parent
        result["error"] = traceback.format_exc()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    sys.stdout.flush()
    sys.stderr.flush()
    # leave without the interpreter's teardown: gloo's teardown at exit can hang or abort a rank
    # after its work is done (seen once in three suite runs: the join then waited its 240 s)
    os._exit(0)
