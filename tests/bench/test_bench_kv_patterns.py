"""bench.bench_kv_patterns: the K/V read-order microbenchmark builds, runs every pattern and saves
its JSON (a tiny --quick run; nothing about speed is asserted)."""
from __future__ import annotations

import json
import shutil

import pytest

from bench import bench_kv_patterns as bench

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler (cc)")


def test_quick_run_saves_every_pattern(tmp_path, capsys):
    out = tmp_path / "kv_patterns.json"
    assert bench.main(["--quick", "--out", str(out)]) == 0
    payload = json.loads(out.read_text())
    assert payload["step_bytes"] == 2 * 2 * 40 * 128 * 4
    for work in ("0", "16"):
        assert set(payload["us_per_step"][work]) == set(bench.PATTERNS)
        assert all(us > 0 for us in payload["us_per_step"][work].values())
    assert "interleaved" in capsys.readouterr().out


def test_bad_arguments_name_the_fix(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--row", "100"])
    assert "--row must be a multiple of 32" in capsys.readouterr().err


def test_a_missing_compiler_is_named(monkeypatch, tmp_path):
    monkeypatch.setenv("CC", "no-such-cc-for-torchair")
    with pytest.raises(RuntimeError, match="no-such-cc-for-torchair"):
        bench.build(str(tmp_path))
