"""bench.bench_kv_read runs (--quick) and saves K/V and weight read speeds side by side and their
ratio. Nothing about speed is asserted."""
from __future__ import annotations

import json

import pytest

from bench import bench_kv_read as bench
from torchair.ops.attention.cpu import launch_library as _launch


@pytest.mark.skipif(not _launch.available(), reason="needs the launch kernels")
def test_quick_run_saves_the_ratio(tmp_path, capsys):
    out = tmp_path / "kv_read.json"
    assert bench.main(["--quick", "--out", str(out)]) == 0
    payload = json.loads(out.read_text())
    assert payload["benchmark"] == "kv_read"
    names = set(payload["us_per_step"])
    assert {"kv-b8", "kv-b1", "weights-linear"} <= names
    assert set(payload["gb_per_s"]) == names == set(payload["bytes_per_step"])
    assert payload["kv_variant"] == "kv-b8" and payload["weights_variant"] in names
    assert payload["ratio"] == pytest.approx(payload["gb_per_s"]["kv-b8"]
                                             / payload["gb_per_s"][payload["weights_variant"]])
    assert payload["bytes_per_step"]["kv-b8"] == 2 * 8 * 40 * 2 * 64 * 4  # the --quick window
    assert all(s["median"] > 0 for s in payload["us_per_step"].values())
    assert {"cpu_model", "nproc", "load_average_at_start"} <= set(payload["machine"])
    assert payload["ratio_p10"] > 0
    assert "K/V read speed" in capsys.readouterr().out
