"""bench.report without running a benchmark: summaries and markdown from small payloads shaped
like the real JSON, README marker replacement, the plot without matplotlib, a failing child."""
from __future__ import annotations

import argparse
import json
import sys
import textwrap
from pathlib import Path

import pytest

from bench import _report_page as PG, _report_run as RUN, _report_summary as S, report as R

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _stats(median: float) -> dict:
    return {"n": 6, "median": median, "p10": 0.9 * median, "p90": 1.1 * median,
            "mean": median, "min": 0.8 * median, "round_medians": [median, median]}


def _decode_step(batches=(1, 4), variants=("eager", "inductor", "torchair")) -> dict:
    results = []
    for b in batches:
        eager = 100.0 * b
        vs = {}
        for k, name in enumerate(variants):
            median = eager / (1 + 0.25 * k)
            vs[name] = {"describe": name, "first_call_s": 0.01 + k, "graphs_compiled": int(k > 0),
                        "check": "reference" if name == "eager" else "ok",
                        "per_step_us": _stats(median), "recompiles_timed": 0,
                        "speedup_vs_eager": eager / median,
                        "speedup_vs_eager_paired": {"n_rounds": 2, "median": eager / median,
                                                    "p10": 1.0, "p90": 1.0}}
        results.append({"batch": b, "variants": vs, "load_average_after_timing": [0.1] * 3})
    return {"benchmark": "decode_step", "machine": MACHINE, "machine_tag": "cpu-2core",
            "config": {"layers": 1, "hidden": 64, "dtype": "float32", "device": "cpu",
                       "batches": list(batches), "steps_per_round": 4, "rounds": 3,
                       "quick": True},
            "results": results, "total_runtime_s": 1.0}


def _fusion() -> dict:
    op = [{"device": "cpu", "pattern": p, "tokens": t, "hidden": 512, "ratio": r,
           "stats_us": {"unfused": _stats(10.0), "fused": _stats(10.0 / r)}}
          for p, t, r in (("a", 1, 1.2), ("a", 64, 1.4), ("c", 1, 0.9))]
    variants = {"eager": {"check": "reference"},
                "torchair-fx-on": {"check": "ok", "patterns_as_expected": True},
                "torchair-fx-off": {"check": "ok", "patterns_as_expected": True}}
    speed = {"eager": {"ratio_of_medians": 1.0, "paired": {"median": 1.01}},
             "fx": {"ratio_of_medians": 1.0, "paired": {"median": 0.99}}}
    return {"benchmark": "fusion", "machines": {"cpu": MACHINE}, "op_level": op,
            "e2e": {"cpu": {"config": {}, "results": [{"batch": 2, "variants": variants,
                                                        "fusion_speedup": speed}]}}}


def _gears() -> dict:
    def variant(traces, speed):
        return {"traces_total": traces, "compile_total_s": 3.5,
                "recompiles_after_first_pass": 0, "check": "ok",
                "per_gear": {"1": {"per_step_us": _stats(100.0), "speedup_vs_eager": speed},
                             "4": {"per_step_us": _stats(300.0), "speedup_vs_eager": speed}}}
    return {"benchmark": "gears", "machine": MACHINE,
            "results": {"gears": [1, 4], "variants": {"eager": variant(None, 1.0),
                                                      "torchair-gears": variant(1, 0.95)}}}


def _cache_compile() -> dict:
    def run(cold, warm):
        return {"cold": {"first_output_s": cold}, "warm": [{"first_output_s": warm}],
                "warm_median_s": warm, "warm_over_cold": warm / cold, "same_output": True}
    return {"machine": MACHINE, "runs": {"ge_cache": run(16.0, 4.0), "no_ge_cache": run(15.0, 15.5),
                                         "overhead_us": {"eager": 4200.0, "cache_compile": 4300.0}}}


def _decode_attention() -> dict:
    row = {"device": "cpu", "dtype": "float32", "batch": 1, "kv_len": 512, "kernel_check": True,
           "kernel_GBps": 10.0, "copy_bw_fraction": 0.2, "speedup_vs_sdpa": 1.5}
    return {"machines": {"cpu": MACHINE}, "rows": [row, {**row, "batch": 8,
                                                        "speedup_vs_sdpa": 0.5}]}


MACHINE = {"platform": "Linux", "python": "3.11.7", "cpu_model": "Test CPU", "nproc": 2,
           "cpu_count": 2, "torch": "2.13.0+cpu", "torch_num_threads": 2, "torchair": "0.1.0",
           "git_commit": "abc1234", "device": "cpu", "load_average_at_start": [0.5, 0.4, 0.3],
           "timestamp": "2026-01-02T03:04:05+00:00"}


def _done(**extra) -> dict:
    payloads = {"decode_step": _decode_step(), "decode_attention": _decode_attention(),
                "fusion": _fusion(), "gears": _gears(), "cache_compile": _cache_compile()}
    return {"payloads": payloads, "runs": {}, "failures": {}, "skipped": {}, **extra}


def _report(**extra) -> dict:
    return S.merge(MACHINE, "cpu-2core", "python bench/report.py", {"quick": False},
                   _done(**extra), 60.0)


def test_decode_step_summary_aligned_with_batches():
    s = S.summarize({"decode_step": _decode_step(batches=(1, 4, 16))})["decode_step"]
    assert s["batches"] == [1, 4, 16]
    assert s["variants"] == ["eager", "inductor", "torchair"]
    assert s["median_us"]["eager"] == [100.0, 400.0, 1600.0]
    assert s["speedup_vs_eager"]["torchair"] == pytest.approx([1.5] * 3)
    assert s["check"]["inductor"] == ["ok"] * 3


def test_decode_step_variant_missing_at_one_batch():
    payload = _decode_step(variants=("eager", "torchair", "reduce-overhead"))
    del payload["results"][1]["variants"]["reduce-overhead"]
    s = S.summarize({"decode_step": payload})["decode_step"]
    assert s["variants"] == ["eager", "reduce-overhead", "torchair"]  # label order
    assert s["median_us"]["reduce-overhead"][1] is None
    assert "| 4 | 400 (1.00x) | - |" in "\n".join(PG.decode_step_table(s))


def test_other_summaries():
    s = _report()["summary"]
    assert s["fusion"]["op_level_ratio"]["a"] == pytest.approx(
        {"cases": 2, "min": 1.2, "median": 1.3, "max": 1.4})
    assert s["fusion"]["e2e_fusion_speedup_paired"]["cpu-batch2"] == {
        "eager": 1.01, "fx": 0.99, "patterns_as_expected": True}
    assert s["gears"]["variants"]["torchair-gears"]["speedup_vs_eager"] == [0.95, 0.95]
    assert s["cache_compile"]["ge_cache"]["warm_over_cold"] == pytest.approx(0.25)
    assert s["cache_compile"]["per_call_us"]["eager"] == 4200.0
    assert s["decode_attention"]["cpu-float32"]["speedup_vs_sdpa_range"] == [0.5, 1.5]


def test_unknown_benchmark_and_bad_payload():
    s = S.summarize({"new_bench": {"machine": {"x": 1}, "rows": [
                         {"name": "sk", "launches": 3, "per_step_us": {"median": 12.5},
                          "other": 7}]},
                     "gears": {"results": {}}})
    assert s["new_bench"] == {"rows[0].launches": 3, "rows[0].per_step_us.median": 12.5}
    assert PG.headline("new_bench", s["new_bench"]) == (
        "- **new bench**: rows[0].launches 3; rows[0].per_step_us.median 12.50")
    assert "KeyError" in s["gears"]["error"]
    assert S.summarize({"x": {"summary": {"launches": 1}}})["x"] == {"launches": 1}


def test_super_kernel_summary():
    def row(part, variant, launches, median, scope_x=None, check="ok"):
        return {"part": part, "variant": variant, "launches": launches, "median_us": median,
                "p10_us": median, "p90_us": median, "vs_eager": 1.0, "scope_x": scope_x,
                "check": check, "describe": "x"}
    payload = {"benchmark": "super_kernel", "machine": MACHINE, "rows": [
        row("chain", "eager", None, 100.0, check="reference"),
        row("chain", "torchair-fx", 50, 90.0),
        row("chain", "torchair-fx+scope", 3, 60.0, 1.5, "ok, == unscoped")]}
    s = S.summarize({"super_kernel": payload})["super_kernel"]
    assert s["chain"]["torchair-fx+scope"] == {"launches": 3, "median_us": 60.0,
                                               "vs_eager": 1.0, "scope_x": 1.5,
                                               "check": "ok, == unscoped"}
    assert PG.headline("super_kernel", s) == (
        "- **super kernel**: chain: eager 100 us; torchair-fx 90 us, launches/step 50; "
        "torchair-fx+scope 60 us, launches/step 3, scope x 1.50")


def test_markdown_has_machine_table_and_headlines():
    rep = _report(failures={"fusion2": {"error": "exit status 1", "stderr_tail": "boom"}},
                  skipped={"super_kernel": "bench/bench_super_kernel.py not found"})
    md = PG.render_markdown(rep, image="cpu-2core.png")
    assert "Test CPU, 2 cores (2 torch threads); torch 2.13.0+cpu, Python 3.11.7, torchair " \
           "0.1.0, commit abc1234, 2026-01-02" in md
    assert "| batch | eager | torch.compile Inductor | torchair (Inductor engine) |" in md
    assert "| 1 | 100 (1.00x) | 80 (1.25x) | 67 (1.50x) |" in md
    assert "Checks vs eager: all ok." in md
    assert "![decode step latency vs batch](cpu-2core.png)" in md
    assert "op level unfused / fused a 1.20-1.40x (median 1.30), c 0.90x" in md
    assert "ge_cache cold 16.0 s, warm 4.0 s (25%)" in md
    assert "**gears** (1 4): eager 100 300 us; torchair-gears traces 1, compile 3.5 s, " \
           "recompiles 0, vs eager 0.95x" in md
    assert "- **fusion2**: FAILED (exit status 1)" in md
    assert "- super_kernel: skipped (bench/bench_super_kernel.py not found)" in md
    assert "`--quick`" not in md


def test_markdown_without_decode_step():
    done = _done()
    del done["payloads"]["decode_step"]
    md = PG.render_markdown(S.merge(MACHINE, "t", "cmd", {"quick": True}, done))
    assert "| batch |" not in md and "smoke run" in md and "**gears**" in md


README = textwrap.dedent("""\
    # proj

    ## Use

    text

    ## Benchmarks

    bench text
    """)


def test_readme_markers_added_at_end_of_bench_section_then_replaced():
    once = PG.replace_readme_block(README + "\n## After\n\nmore\n", "TABLE 1")
    assert once.index("bench text") < once.index(PG.MARK_START) < once.index("## After")
    assert f"{PG.MARK_START}\nTABLE 1\n{PG.MARK_END}\n\n## After" in once
    twice = PG.replace_readme_block(once, "TABLE 2\n")
    assert "TABLE 1" not in twice and twice.count(PG.MARK_START) == 1
    assert twice == once.replace("TABLE 1", "TABLE 2")


def test_readme_markers_at_end_or_before_layout():
    at_end = PG.replace_readme_block(README, "T")
    assert at_end.endswith(f"bench text\n\n{PG.MARK_START}\nT\n{PG.MARK_END}\n")
    layout = "# p\n\n## Use\n\nx\n\n## Layout\n\ny\n"
    out = PG.replace_readme_block(layout, "T")
    assert out == f"# p\n\n## Use\n\nx\n\n{PG.MARK_START}\nT\n{PG.MARK_END}\n\n## Layout\n\ny\n"
    with pytest.raises(ValueError, match="only one"):
        PG.replace_readme_block(f"a\n{PG.MARK_START}\nb\n", "T")


def test_real_readme_has_one_marker_pair():
    text = R.REPORT_PAGE.read_text(encoding="utf-8")
    assert text.count(PG.MARK_START) == 1 and text.count(PG.MARK_END) == 1
    assert PG.replace_readme_block(text, "T").count(PG.MARK_START) == 1


def test_plot_skipped_without_matplotlib(tmp_path, monkeypatch, capsys):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import raises ImportError
    assert PG.write_plot(_report(), tmp_path / "x.png") is None
    assert 'pip install -e ".[bench]"' in capsys.readouterr().out
    assert not (tmp_path / "x.png").exists()


def test_plot_written(tmp_path):
    pytest.importorskip("matplotlib")
    path = PG.write_plot(_report(), tmp_path / "x.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _opts(**kw) -> argparse.Namespace:
    return argparse.Namespace(**{"device": "cpu", "batch": [1, 2], "threads": None,
                                 "quick": True, "timeout": 30.0, **kw})


def test_child_argv_passes_only_flags_the_script_defines(tmp_path, monkeypatch):
    script = tmp_path / "bench_fake.py"
    script.write_text('p.add_argument("--quick")\np.add_argument("--batch")\n')
    monkeypatch.setattr(RUN, "HERE", tmp_path)
    monkeypatch.setattr(RUN, "ROOT", tmp_path)
    argv = RUN.child_argv(RUN.Bench("fake", batch_sweep=True), _opts(threads=1), tmp_path / "o.json")
    assert argv[1:] == ["-m", "bench_fake", "--batch", "1", "2", "--quick", "--out",
                        str(tmp_path / "o.json")]


def test_failing_child_recorded_and_others_run(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(RUN, "HERE", tmp_path)
    monkeypatch.setattr(RUN, "ROOT", tmp_path)
    (tmp_path / "bench_bad.py").write_text(
        "import sys\nprint('working')\nprint('Traceback: it broke', file=sys.stderr)\n"
        "sys.exit(3)\n")
    (tmp_path / "bench_good.py").write_text(
        "import json, sys\nout = sys.argv[sys.argv.index('--out') + 1]\n"
        "json.dump({'value': 1, 'launches': 2}, open(out, 'w'))\n")
    benches = [RUN.Bench("bad"), RUN.Bench("missing"), RUN.Bench("good")]
    done = RUN.run_benchmarks(benches, _opts(), tmp_path)
    assert done["payloads"] == {"good": {"value": 1, "launches": 2}}
    bad = done["failures"]["bad"]
    assert bad["returncode"] == 3 and bad["error"] == "exit status 3"
    assert "it broke" in bad["stderr_tail"]
    assert done["skipped"] == {"missing": "bench_missing.py not found"}
    assert done["runs"]["bad"]["ok"] is False and done["runs"]["good"]["ok"] is True
    assert done["runs"]["good"]["command"] == "python -m bench_good"
    out = capsys.readouterr().out
    assert "[1/2] bad" in out and "working" in out and "bad FAILED (exit status 3)" in out
    rep = S.merge(MACHINE, "t", "cmd", {"quick": True}, done)
    json.dumps(rep)  # serializable
    assert rep["summary"] == {"good": {"launches": 2}}
    assert "- **bad**: FAILED (exit status 3)" in PG.render_markdown(rep)


def test_main_writes_json_png_markdown_and_readme(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    monkeypatch.setattr(RUN, "HERE", tmp_path)
    monkeypatch.setattr(RUN, "ROOT", tmp_path)
    monkeypatch.setattr(R, "ROOT", tmp_path)
    monkeypatch.setattr(R, "REPORT_PAGE", tmp_path / "README.md")
    monkeypatch.setattr(R, "BENCHES", (RUN.Bench("decode_step", batch_sweep=True),
                                       RUN.Bench("bad")))
    (tmp_path / "README.md").write_text(README)
    (tmp_path / "payload.json").write_text(json.dumps(_decode_step()))
    (tmp_path / "bench_decode_step.py").write_text(
        "import shutil, sys\n# '--batch' '--device'\n"
        f"shutil.copy({str(tmp_path / 'payload.json')!r}, sys.argv[sys.argv.index('--out') + 1])\n")
    (tmp_path / "bench_bad.py").write_text("raise SystemExit(2)\n")
    out = tmp_path / "results"
    rc = R.main(["--quick", "--device", "cpu", "--out-dir", str(out), "--update-readme"])
    assert rc == 1
    tag = next(out.glob("*.json")).stem
    assert tag.endswith("_quick")
    rep = json.loads((out / f"{tag}.json").read_text())
    assert rep["runs"]["decode_step"]["command"] == (
        "python -m bench_decode_step --device cpu --batch 1 4 16")
    assert rep["failures"]["bad"]["returncode"] == 2
    assert rep["benchmarks"]["decode_step"]["benchmark"] == "decode_step"
    assert (out / f"{tag}.png").exists()
    assert f"]({tag}.png)" in (out / f"{tag}.md").read_text()
    readme = (tmp_path / "README.md").read_text()
    assert f"]({out.relative_to(tmp_path)}/{tag}.png)" in readme and "| 4 | 400 (1.00x) |" in readme


def test_child_without_json_or_too_slow_fails(tmp_path):
    rec = RUN.run_child([sys.executable, "-c", "import time; time.sleep(5)"], timeout=0.3)
    assert rec["timed_out"] and rec["elapsed_s"] < 4
    assert RUN.read_payload(rec, tmp_path / "none.json")[1].startswith("timed out")
    rec = RUN.run_child([sys.executable, "-c", "pass"])
    assert "no JSON" in RUN.read_payload(rec, tmp_path / "none.json")[1]


@pytest.mark.parametrize("name", ["decode_step", "decode_attention", "fusion", "gears",
                                  "cache_compile"])
def test_summaries_of_saved_results(name):
    """The committed results of each benchmark (if any) summarize and render."""
    files = sorted((BENCH / "results").glob(f"{name}_cpu-*.json"))
    if not files:
        pytest.skip(f"no bench/results/{name}_*.json")
    s = S.summarize({name: json.loads(files[0].read_text())})[name]
    assert "error" not in s
    PG.headline(name, s) if name != "decode_step" else PG.decode_step_table(s)
