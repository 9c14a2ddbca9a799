"""bench.bench_ifa_call runs (one tiny round) and saves every variant's per-call time; the
variants were checked to compute the same attention before timing. Nothing about speed is
asserted."""
from __future__ import annotations

import json

import pytest

from bench import bench_ifa_call as bench
from torchair.ops.attention.cpu import native as _decode_native


@pytest.mark.skipif(not _decode_native.available(), reason="needs the native kernel")
def test_tiny_run_saves_every_variant(tmp_path, capsys):
    out = tmp_path / "ifa_call.json"
    assert bench.main(["--rounds", "1", "--calls", "2", "--kv", "64", "--len", "40",
                       "--out", str(out)]) == 0
    payload = json.loads(out.read_text())
    per_call = payload["per_call_us"]
    from torchair.ops.attention.cpu import launch_library as _launch

    launch = {"launch"} if _launch.available() else set()
    assert set(per_call) == {"kernel", "ctypes-noop", "fast", "op", "twin", "general",
                             "sdpa"} | launch
    assert payload["kernel_own_us"] == pytest.approx(per_call["kernel"]["median"]
                                                     - per_call["ctypes-noop"]["median"])
    assert all(v["median"] > 0 and v["n"] == 1 for v in per_call.values())
    assert "x kernel" in capsys.readouterr().out
