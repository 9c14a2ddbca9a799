"""bench.bench_fia_prompt runs (one tiny round) and saves every variant's per-call time; before
timing it checked that the variants compute eager's attention and that the bound unit calls
``torchair_native::fia_prompt`` while the other calls FIA's Python op. Nothing about speed is
asserted."""
from __future__ import annotations

import json

import pytest

from bench import bench_fia_prompt as bench
from torchair.ops.attention.cpu import launch_library as _launch


@pytest.mark.skipif(not _launch.available(), reason="needs the launch kernels")
def test_tiny_run_saves_every_variant(tmp_path, capsys):
    out = tmp_path / "fia_prompt.json"
    assert bench.main(["--lengths", "8", "20", "--rounds", "1", "--calls", "2",
                       "--out", str(out)]) == 0
    payload = json.loads(out.read_text())
    assert [r["length"] for r in payload["results"]] == [8, 20]
    for result in payload["results"]:
        assert set(result["per_call_us"]) == {"unit-launch", "unit-general", "eager", "sdpa"}
        assert result["launch_kernels"] == {"unit-launch": 1, "unit-general": 0}
        assert all(v["median"] > 0 and v["n"] == 1 for v in result["per_call_us"].values())
    assert "x sdpa" in capsys.readouterr().out
