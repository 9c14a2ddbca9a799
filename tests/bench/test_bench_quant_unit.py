"""bench.bench_quant_unit runs (tiny shapes) and saves every variant with its difference from
eager: the unit calling the ops is bit-exact, the lowered unit within two output steps. Nothing
about speed is asserted."""
from __future__ import annotations

import json

import pytest

from bench import bench_quant_unit as bench


@pytest.mark.inductor
def test_quick_run_saves_every_variant(tmp_path, capsys):
    out = tmp_path / "quant_unit.json"
    assert bench.main(["--quick", "--out", str(out)]) == 0
    payload = json.loads(out.read_text())
    (result,) = payload["results"]
    variants = result["variants"]
    assert set(variants) == {"eager", "torchair", "torchair-calls"}
    assert variants["torchair-calls"]["max_diff_in_output_steps"] == 0
    assert variants["torchair"]["max_diff_in_output_steps"] <= 2
    assert all(v["median"] > 0 for v in variants.values())
    assert "torchair-calls" in capsys.readouterr().out
