"""bench.bench_cached_call runs (FX engine, tiny model, few rounds): every position of the round
timed for every variant, the layered cached call split into check, unit and rest (timed from the
entry's own instance attributes, which Runtime.serve calls), and the timing wrappers removed
afterwards. Nothing about speed is asserted."""
from __future__ import annotations

import json

from bench import bench_cached_call as bench


def test_quick_run_splits_the_cached_call(tmp_path, capsys, monkeypatch):
    runtimes = []
    split = bench._Split

    def recorded(runtime):
        runtimes.append((runtime, runtime._check, runtime.unit))
        return split(runtime)

    monkeypatch.setattr(bench, "_Split", recorded)
    out = tmp_path / "cached_call.json"
    assert bench.main(["--quick", "--engine", "fx", "--steps", "3", "--out", str(out)]) == 0
    (runtime, check, unit), = runtimes
    assert (runtime._check, runtime.unit) == (check, unit)  # the timing wrappers are gone
    payload = json.loads(out.read_text())
    assert set(payload["by_position_us"]) == {"torchair-cache", "layered", "torchair-nodynamo"}
    assert runtime.fast is None  # the split times the layered call's parts
    for rows in (payload["by_position_us"], payload["cache_split_by_position_us"]):
        assert all(len(v) == 3 and all(x > 0 for x in v) for v in rows.values())
    split = payload["cache_split_by_position_us"]
    assert set(split) == {"check", "unit", "rest"}
    # the parts are pieces of the cached call (medians per position, so only roughly additive)
    for k in range(3):
        assert split["check"][k] + split["unit"][k] <= payload["by_position_us"]["layered"][k] * 1.5
    assert "check" in capsys.readouterr().out
