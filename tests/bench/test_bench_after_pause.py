"""bench.bench_after_pause runs (FX engine, tiny model, few rounds): every predecessor and target
timed at every position, the first-step ratios derived from those medians, and the garbage
collector back on and unfrozen afterwards. Nothing about speed is asserted."""
from __future__ import annotations

import gc
import json

import pytest

from bench import bench_after_pause as bench


def test_quick_run_times_every_predecessor_and_target(tmp_path, capsys):
    out = tmp_path / "after_pause.json"
    assert bench.main(["--quick", "--engine", "fx", "--steps", "3", "--pause-ms", "0.2",
                       "--out", str(out)]) == 0
    targets = list(bench.TARGETS)
    assert gc.isenabled() and gc.get_freeze_count() == 0
    payload = json.loads(out.read_text())
    table = payload["by_position_us"]
    assert set(table) == set(bench.PREDECESSORS)
    for by in table.values():
        assert list(by) == targets
        assert all(len(v) == 3 and all(x > 0 for x in v) for v in by.values())
    for p, by in payload["first_over_steady"].items():
        for t, ratio in by.items():  # steady state: the last third of 3 steps, the last one
            assert abs(ratio - table[p][t][0] / table[p][t][-1]) < 1e-9
    assert "after sleep" in capsys.readouterr().out


def test_times_only_the_targets_asked_for(tmp_path):
    out = tmp_path / "after_pause.json"
    assert bench.main(["--quick", "--steps", "2", "--pause-ms", "0", "--targets", "floor-gemv",
                       "--out", str(out)]) == 0
    payload = json.loads(out.read_text())
    assert payload["config"]["targets"] == ["floor-gemv"]
    assert all(list(by) == ["floor-gemv"] for by in payload["by_position_us"].values())


def test_rejects_a_negative_pause(capsys):
    with pytest.raises(SystemExit) as exc:
        bench.parse_args(["--pause-ms", "-1"])
    assert exc.value.code == 2
    assert "--pause-ms" in capsys.readouterr().err
