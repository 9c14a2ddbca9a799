"""bench.bench_serve: the graph batch sizes per concurrency, the demo's command line, its summary,
headline and plot in bench.report from a payload shaped like the real JSON, and one quick real
run (tiny model, FX engine). Nothing about speed is asserted."""
from __future__ import annotations

import argparse
import json
import sys

import pytest

from bench import _report_page as PG, _report_run as RUN, _report_summary as S, bench_serve

MACHINE = {"platform": "Linux", "python": "3.11.7", "cpu_model": "Test CPU", "nproc": 2,
           "cpu_count": 2, "torch": "2.13.0+cpu", "torch_num_threads": 2, "torchair": "0.1.0",
           "git_commit": "abc1234", "device": "cpu", "load_average_at_start": [0.5, 0.4, 0.3],
           "timestamp": "2026-01-02T03:04:05+00:00"}
TINY = ["--layers", "1", "--hidden", "64", "--heads", "4", "--kv-heads", "2", "--vocab", "64"]


def _point(c: int, eager: float, graph: float) -> dict:
    return {"concurrency": c, "graph_batch_sizes": bench_serve.graph_sizes(c),
            "throughput_tokens_per_s": {"eager": eager, "torchair": graph},
            "throughput_ratio": graph / eager,
            "ttft_p50_ms": {"eager": 10.0, "torchair": 8.0},
            "tpot_p50_ms": {"eager": 2.0, "torchair": 1.5},
            "tpot_p99_ms": {"eager": 3.0, "torchair": 2.5},
            "padding_waste": 0.05 * (c > 1), "all_tokens_equal": True, "ok": True,
            "requests_exact": 32, "near_tie_divergences": 0, "recompiles_after_warmup": 0,
            "dynamo_compiles": 2, "generated_tokens": 1000, "returncode": 0}


def _payload(failed: bool = False) -> dict:
    points = [_point(1, 100.0, 120.0), _point(2, 180.0, 250.0), _point(4, 300.0, 450.0)]
    if failed:
        points.append({"concurrency": 8, "graph_batch_sizes": [1, 2, 4, 8],
                       "error": "exit status 1; no result", "stderr_tail": "boom",
                       "returncode": 1})
    return {"benchmark": "serve", "machine": MACHINE, "machine_tag": "cpu-2core",
            "config": {"device": "cpu", "engine": "inductor", "requests": 32, "rounds": 3,
                       "speculate": 0, "quick": False, "concurrency": [1, 2, 4]},
            "points": points[::-1]}  # out of order: the summary sorts by concurrency


def _report(**payloads) -> dict:
    done = {"payloads": payloads, "runs": {}, "failures": {}, "skipped": {}}
    return S.merge(MACHINE, "cpu-2core", "python -m bench.report", {"quick": False}, done)


def test_graph_sizes_are_the_powers_of_two_below_c_then_c():
    assert bench_serve.graph_sizes(1) == [1]
    assert bench_serve.graph_sizes(4) == [1, 2, 4]
    assert bench_serve.graph_sizes(6) == [1, 2, 4, 6]
    assert bench_serve.graph_sizes(8) == [1, 2, 4, 8]


def test_demo_argv_and_defaults():
    args = bench_serve.parse_args(["--quick", "--device", "cpu", *TINY, "--speculate", "2"])
    assert (args.concurrency, args.requests, args.rounds, args.engine) == ([1, 4], 8, 1, "fx")
    assert (args.prompt_lens, args.output_lens) == ([4, 32], [4, 16])
    argv = bench_serve.demo_argv(args, 4, "o.json")
    assert argv[:5] == [sys.executable, "-m", "torchair", "demo", "--serve"]
    text = " ".join(argv[1:])
    for part in ("--max-batch 4 --graph-batch-sizes 1 2 4", "--engine fx", "--requests 8",
                 "--rounds 1", "--speculate 2", "--layers 1", "--kv-heads 2", "--vocab 64",
                 "--json o.json"):
        assert part in text, part
    assert "--threads" not in text and "--intermediate" not in text
    full = bench_serve.parse_args(["--device", "cpu", "--concurrency", "8", "2"])
    assert (full.concurrency, full.requests, full.rounds, full.engine) == (
        [2, 8], 32, 3, "inductor")


def test_report_runs_it_with_the_flags_it_defines(tmp_path):
    assert RUN.Bench("serve") in RUN.BENCHES
    opts = argparse.Namespace(device="cpu", batch=[1], threads=1, quick=True)
    argv = RUN.child_argv(RUN.Bench("serve"), opts, tmp_path / "o.json")
    assert argv[1:] == ["-m", "bench.bench_serve", "--device", "cpu", "--threads", "1",
                        "--quick", "--out", str(tmp_path / "o.json")]


def test_summarize_serve_and_headline():
    s = _report(serve=_payload(failed=True))["summary"]["serve"]
    assert s["concurrency"] == [1, 2, 4, 8]
    assert s["throughput_tokens_per_s"] == {"eager": [100.0, 180.0, 300.0, None],
                                            "torchair": [120.0, 250.0, 450.0, None]}
    assert s["throughput_ratio"][:3] == pytest.approx([1.2, 250 / 180, 1.5])
    assert s["ttft_p50_ms"]["torchair"] == [8.0, 8.0, 8.0, None]
    assert s["tpot_p99_ms"]["eager"] == [3.0, 3.0, 3.0, None]
    assert s["padding_waste"] == [0.0, 0.05, 0.05, None]
    assert s["all_tokens_equal"] == [True, True, True, None] and s["tokens_ok"] is True
    assert s["recompiles_after_warmup"] == [0, 0, 0, None]
    assert s["dynamo_compiles"] == [2, 2, 2, None]
    assert s["errors"] == {"8": "exit status 1; no result"}
    assert s["config"]["engine"] == "inductor"
    line = PG.headline("serve", s)
    assert line == ("- **serve** (inductor engine, 32 requests): generated tokens/s eager / "
                    "torchair c=1 100 / 120 (1.20x), c=2 180 / 250 (1.39x), c=4 300 / 450 "
                    "(1.50x), c=8 FAILED; tokens all equal; recompiles after warm-up 0; "
                    "padding waste up to 5%")
    md = PG.render_markdown(_report(serve=_payload()), serve_image="cpu-2core_serve.png")
    assert "- **serve** (inductor engine" in md
    assert "![serving tokens/s vs concurrency](cpu-2core_serve.png)" in md


def test_summarize_serve_bad_payload_is_an_error():
    s = S.summarize({"serve": {"points": [{"concurrency": 1}]}})["serve"]
    assert "KeyError" in s["error"]
    assert PG.headline("serve", s).startswith("- **serve**: summary failed")


def test_serve_plot_written(tmp_path):
    pytest.importorskip("matplotlib")
    path = PG.write_serve_plot(_report(serve=_payload(failed=True)), tmp_path / "s.png")
    assert path == tmp_path / "s.png"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_serve_plot_skipped_without_results_or_matplotlib(tmp_path, monkeypatch, capsys):
    assert PG.write_serve_plot(_report(), tmp_path / "a.png") is None
    assert "no serve plot" in capsys.readouterr().out
    failed = _payload(failed=True)
    failed["points"] = [p for p in failed["points"] if "error" in p]
    assert PG.write_serve_plot(_report(serve=failed), tmp_path / "b.png") is None
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import raises ImportError
    assert PG.write_serve_plot(_report(serve=_payload()), tmp_path / "c.png") is None
    assert 'pip install -e ".[bench]"' in capsys.readouterr().out
    assert not list(tmp_path.glob("*.png"))


def test_quick_run_records_every_concurrency(tmp_path, capsys):
    out = tmp_path / "serve.json"
    rc = bench_serve.main(["--quick", "--device", "cpu", *TINY, "--requests", "4",
                           "--out", str(out)])
    payload = json.loads(out.read_text())
    assert rc == 0, payload["points"]
    assert payload["benchmark"] == "serve" and payload["machine"]["nproc"] >= 1
    assert [p["concurrency"] for p in payload["points"]] == [1, 4]
    for p in payload["points"]:
        assert "error" not in p, p
        assert p["graph_batch_sizes"] == bench_serve.graph_sizes(p["concurrency"])
        assert p["throughput_tokens_per_s"]["eager"] > 0
        assert p["throughput_tokens_per_s"]["torchair"] > 0
        assert p["all_tokens_equal"] and p["recompiles_after_warmup"] == 0
    assert "serving throughput vs concurrency" in capsys.readouterr().out
    s = S.summarize({"serve": payload})["serve"]
    assert s["concurrency"] == [1, 4] and s["tokens_ok"] is True
