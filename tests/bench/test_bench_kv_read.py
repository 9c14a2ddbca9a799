"""bench.bench_kv_read runs (--quick) and saves K/V and weight read speeds side by side and their
ratio. Nothing about speed is asserted."""
from __future__ import annotations

import argparse
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


@pytest.mark.parametrize("llc_mib", [None, 20, 64])
def test_both_sides_read_a_footprint_of_8x_the_last_level_cache(monkeypatch, llc_mib):
    # one 23 MiB set of weights fits a 32 MiB L3: read again and again it streams from the
    # cache, while the KV sets are read from memory, and the ratio compares two memory levels;
    # at 2x and 4x the L3 a cyclic read still hit in part (measured), so 8x
    llc = llc_mib and llc_mib * 2**20
    monkeypatch.setattr(bench._roofline, "last_level_cache_bytes", lambda: llc)
    variants, weight_bytes, weight_sets, footprint = bench._weight_variants(1, quick=False)
    assert footprint == weight_bytes * weight_sets >= 8 * (llc or 32 * 2**20)
    assert footprint - weight_bytes < 8 * (llc or 32 * 2**20)  # no more sets than it takes
    args = argparse.Namespace(heads=8, kv_heads=2, dim=64, kv=64, len=40, layout="BSH", sets=2)
    _step, _nbytes, kv_sets = bench._kv_variant(args, 8, footprint)
    assert kv_sets * 2 * 8 * 64 * 2 * 64 * 4 >= footprint
    # every weight set is read in turn: the step's products change with the set
    name = "weights-linear"
    calls = []
    monkeypatch.setattr(bench.F, "linear", lambda x, w: calls.append(w.data_ptr()))
    for i in range(weight_sets):
        variants[name](i)
    assert len(set(calls)) == 14 * weight_sets
    assert bench._cold_bytes(weight_bytes, quick=True) == 0
