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
    assert payload["served_split_by_position_us"] == {}  # FX engine: no fused call to time
    split = payload["cache_split_by_position_us"]
    assert set(split) == {"check", "unit", "rest"}
    # the parts are pieces of the cached call (medians per position, so only roughly additive)
    for k in range(3):
        assert split["check"][k] + split["unit"][k] <= payload["by_position_us"]["layered"][k] * 1.5
    assert "check" in capsys.readouterr().out


def test_fused_timer_times_the_units_fused_call_and_puts_it_back():
    """The served call's split: the unit's fused call wrapped in a timer, the runtime told to
    make its generated function again (around the timer) on entry and on exit; a unit without a
    fused call (the FX engine) is left alone."""
    made = []

    class Unit:
        def __init__(self, fused):
            self._fast = fused

    class Runtime:
        def __init__(self, unit):
            self.unit = unit

        def rebuild_fast(self):
            made.append(self.unit._fast)

    def fused(flat):
        return [sum(flat)]

    runtime = Runtime(Unit(fused))
    with bench._FusedTimer(runtime) as timer:
        assert runtime.unit._fast is not fused and made == [runtime.unit._fast]
        assert runtime.unit._fast([1, 2]) == [3]
        assert timer.last["unit"] > 0
    assert runtime.unit._fast is fused and made[-1] is fused
    bare = Runtime(Unit(None))
    with bench._FusedTimer(bare) as timer:
        assert bare.unit._fast is None
    assert timer.last == {} and len(made) == 2
