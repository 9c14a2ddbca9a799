"""``python -m bench.bench_tp --quick`` runs its own 2-rank gloo world (bounded) and saves every
row: TP=1 and TP=2, eager and torchair, plus the all_reduce and no-reduce diagnostics; TP=2 and
TP=1 torchair were checked against TP=1 eager before timing. Nothing about speed is asserted."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_quick_run_saves_every_row(tmp_path):
    out = tmp_path / "tp.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    proc = subprocess.run([sys.executable, "-m", "bench.bench_tp", "--quick",
                           "--out", str(out)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    payload = json.loads(out.read_text())
    assert payload["config"]["tp"] == [1, 2] and payload["config"]["torch_threads_per_rank"] == 1
    (batch,) = payload["results"]
    variants = batch["variants"]
    assert set(variants) == {"tp1/eager", "tp1/torchair", "tp1/eager-2threads",
                             "tp2/eager", "tp2/torchair",
                             "tp2/allreduce-only", "tp2/eager-noreduce"}
    for key in ("tp1/torchair", "tp1/eager-2threads",
                             "tp2/eager", "tp2/torchair"):
        assert variants[key]["check"] == "ok", (key, variants[key])
    for key, v in variants.items():
        assert v["per_step_us"]["n"] == 3 * 4 and v["per_step_us"]["median"] > 0, key
    (report,) = variants["tp2/torchair"]["torchair_reports"]
    assert report["path"] == 4 and report["build_static"], report
    assert report["collectives"] == "all_reduce x2 inside the launch unit (gloo, host)"
    for rank in (0, 1):
        split = variants["tp2/eager"][f"breakdown_rank{rank}"]
        assert split["in_allreduce_us"]["n"] == 12 and split["in_allreduce_us"]["median"] > 0
    assert "speedup vs eager TP=1" in proc.stdout
