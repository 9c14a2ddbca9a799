"""bench.bench_call_cost runs (FX engine, few rounds): a cold and a warm process, every variant
timed, the warm process served from the entry the cold one wrote. Nothing about speed is
asserted."""
from __future__ import annotations

import json

import torch

from bench import bench_call_cost as bench


def test_quick_run_times_every_variant_in_both_processes(tmp_path, capsys):
    out = tmp_path / "call_cost.json"
    bench.main(["--quick", "--engine", "fx", "--out", str(out)])
    assert torch.is_grad_enabled()  # the run leaves the process's grad mode as it found it
    payload = json.loads(out.read_text())
    assert set(payload["cold"]) == {"eager", "torch.compile", "cache_compile", "cache_check",
                                    "unit", "floor"}
    assert set(payload["warm"]) == {"eager", "cache_compile", "cache_check", "unit", "floor"}
    for stats in (*payload["cold"].values(), *payload["warm"].values()):
        assert stats["median"] > 0
    assert payload["warm_served_from_entry"], capsys.readouterr().out
    assert "cache_check" in capsys.readouterr().out


def test_the_module_computes_its_formula():
    model, (x, y) = bench.CallCost(), bench._inputs()
    expected = x + y + torch.stack(list(model.params)).sum(0)
    torch.testing.assert_close(model(x, y), expected)
