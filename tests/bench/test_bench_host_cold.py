"""bench.bench_host_cold runs (FX engine, tiny model, few rounds): every part timed cold and warm,
the launch unit stubbed out only while timing (afterwards the next call computes again), the
collector's state kept. Nothing about speed is asserted."""
from __future__ import annotations

import gc
import json

import torch

from bench import bench_host_cold as bench


def test_quick_run_times_every_part_with_the_unit_stubbed_meanwhile(tmp_path, capsys,
                                                                   monkeypatch):
    seen: dict = {}
    time_parts, measure = bench.time_parts, bench.measure

    def watched_time_parts(parts, sweep, rounds, warm_calls):
        runtime = seen["cached"].runtime
        seen["unit_while_timing"] = type(runtime.unit)
        return time_parts(parts, sweep, rounds, warm_calls)

    def watched_measure(cached, call_args, sweep, rounds, warm_calls):
        seen.update(cached=cached, args=call_args, real=cached.runtime.unit)
        return measure(cached, call_args, sweep, rounds, warm_calls)

    monkeypatch.setattr(bench, "time_parts", watched_time_parts)
    monkeypatch.setattr(bench, "measure", watched_measure)
    out = tmp_path / "host_cold.json"
    assert bench.main(["--quick", "--engine", "fx", "--out", str(out)]) == 0
    payload = json.loads(out.read_text())
    for kind in ("cold_us", "warm_us"):
        assert list(payload[kind]) == list(bench.PARTS)
        assert all(v > 0 for v in payload[kind].values())
    assert gc.isenabled() and gc.get_freeze_count() == 0
    assert "cold / warm" in capsys.readouterr().out
    assert seen["unit_while_timing"] is bench._StubUnit
    cached, args = seen["cached"], seen["args"]
    assert cached.runtime.unit is seen["real"]
    # the real unit again: a call with another input computes it (the stub would repeat)
    x, pos, lens, k_caches, v_caches = args
    with torch.no_grad():
        before = cached(*args)
        other = cached(x * 2 + 1, pos, lens, k_caches, v_caches)
    assert not torch.allclose(before, other)
