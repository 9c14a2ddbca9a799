"""bench.bench_gpu_step on CPU (the CUDA graph's CPU emulation, tiny model): every variant and
style is timed beside the captured replay, the cached step equals eager in both input styles.
Nothing about speed is asserted."""
from __future__ import annotations

import json

from bench import bench_gpu_step as bench


def test_quick_cpu_run_times_the_cached_step_beside_its_replay(tmp_path):
    out = tmp_path / "gpu_step.json"
    bench.main(["--quick", "--device", "cpu", "--variants", "eager", "torchair-cache",
                "--out", str(out)])
    payload = json.loads(out.read_text())
    (batch,) = payload["batches"]
    assert batch["variants"]["torchair-cache"]["check_persistent"] == "ok"
    assert batch["variants"]["torchair-cache"]["check_fresh"] == "ok"
    rows = batch["timings"]
    assert set(rows) == {"eager/persistent", "eager/fresh", "torchair-cache/persistent",
                         "torchair-cache/fresh", "replay", "replay+pageable copy",
                         "replay+pinned copy", "replay+clone"}
    for row in rows.values():
        assert row["host_us"] > 0 and row["step_us"] >= row["host_us"] and row["calls"] == 6
    ratios = batch["cached_host_x_replay_host"]
    assert set(ratios) == {"persistent", "fresh"} and all(r > 0 for r in ratios.values())
