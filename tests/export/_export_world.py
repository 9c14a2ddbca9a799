"""Each rank of a 2-process gloo world exports AllReduceModel with dynamo_export, then loads its
own package with load_export and compares it with eager (spawned by test_dynamo_export.py)."""
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

        import torchair
        from _export_models import AllReduceModel

        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world, timeout=datetime.timedelta(seconds=120))
        x = torch.ones(2, 2) * (rank + 1)
        y = torch.full((2, 2), 0.5)
        model = AllReduceModel()
        result["path"] = torchair.dynamo_export(x, y, model=model, export_path=export_path)
        loaded = torchair.load_export(export_path)  # this rank's package
        out = loaded(x, y)
        ref = model(x.clone(), y)
        result["equal"] = bool(torch.allclose(out, ref))
        result["out"] = out.tolist()
        dist.barrier()
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - reported to the parent
        result["error"] = traceback.format_exc()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    sys.stdout.flush()
