"""One command for the benchmark report: run every benchmark, merge, plot, tabulate.

    python -m bench.report                    # full run, ~25 min on 2 CPU cores
    python -m bench.report --quick            # smoke run, ~6 min on 2 CPU cores
    python -m bench.report --only decode_step gears --update-readme

Each benchmark runs as its own process, from the repository root (``python -m
bench.bench_<name> ... --out <tmp json>``), its output streamed with a header and the elapsed
time. A benchmark that fails is recorded (exit status, stderr tail) and the others still run; the
report then exits with status 1. A benchmark whose script does not exist is skipped and listed as
such.
Flags a script does not define are not passed to it (``--threads`` to ``bench_cache_compile.py``).

Writes, for the machine tag of ``_harness.machine_tag`` (``cpu-2core``, the GPU name on CUDA;
``-<n>thread`` with ``--threads``, ``_quick`` with ``--quick``):

* ``bench/results/<tag>.json``: machine and versions, the command, every benchmark's full JSON
  (``benchmarks``), what ran (``runs``), ``failures``, ``skipped`` and a compact ``summary``;
* ``bench/results/<tag>.png``: decode step median latency vs batch, one line per variant
  (needs matplotlib: ``pip install -e ".[bench]"``; skipped with a message without it);
* ``bench/results/<tag>.md``: the decode step table and one line per other benchmark, also
  put between the ``bench-report`` markers of ``docs/benchmarks.md`` with ``--update-readme``.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from bench import _harness as H

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
REPORT_PAGE = ROOT / "docs" / "benchmarks.md"  # the page --update-readme rewrites
MARK_START = "<!-- bench-report:start -->"
MARK_END = "<!-- bench-report:end -->"
FULL_BATCHES = (1, 2, 4, 8, 16)
QUICK_BATCHES = (1, 4, 16)
TAIL_LINES = 60

# decode step variants in table / plot order, with their labels
VARIANT_LABELS = {
    "eager": "eager",
    "inductor": "torch.compile Inductor",
    "reduce-overhead": "torch.compile reduce-overhead",
    "torchair": "torchair (Inductor engine)",
    "torchair-fx": "torchair (FX engine)",
}


@dataclasses.dataclass(frozen=True)
class Bench:
    """One benchmark script; ``batch_sweep``: it takes the report's ``--batch`` list."""
    name: str
    batch_sweep: bool = False

    @property
    def script(self) -> Path:
        return HERE / f"bench_{self.name}.py"

    @property
    def module(self) -> str:
        """The script's module name for ``python -m``, from the repository root."""
        return ".".join(self.script.relative_to(ROOT).with_suffix("").parts)


BENCHES = (Bench("decode_step", batch_sweep=True), Bench("decode_attention"), Bench("fusion"),
           Bench("gears"), Bench("cache_compile"), Bench("super_kernel"))


# ------------------------------------------------------------------------------ running

def child_argv(bench: Bench, opts: argparse.Namespace, out: Path) -> list[str]:
    """The command line of one benchmark; flags its source does not mention are left out."""
    source = bench.script.read_text(encoding="utf-8")
    wanted: list[list[str]] = [["--device", opts.device]]
    if bench.batch_sweep:
        wanted.append(["--batch", *map(str, opts.batch)])
    if opts.threads is not None:
        wanted.append(["--threads", str(opts.threads)])
    if opts.quick:
        wanted.append(["--quick"])
    argv = [sys.executable, "-m", bench.module]
    for flag in wanted:
        if f'"{flag[0]}"' in source or f"'{flag[0]}'" in source:
            argv += flag
    return argv + ["--out", str(out)]


def _pump(stream, sink, tail: deque) -> None:
    for line in iter(stream.readline, ""):
        sink.write(line)
        sink.flush()
        tail.append(line)


def run_child(argv: Sequence[str], timeout: float | None = None) -> dict[str, Any]:
    """Run one command from the repository root, streaming its stdout and stderr; return its
    exit status, seconds and the last lines of each stream."""
    tails: dict[str, deque] = {"stdout": deque(maxlen=TAIL_LINES),
                               "stderr": deque(maxlen=TAIL_LINES)}
    start = time.perf_counter()
    proc = subprocess.Popen(list(argv), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, bufsize=1, start_new_session=True,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"))
    pumps = [threading.Thread(target=_pump, args=(proc.stdout, sys.stdout, tails["stdout"])),
             threading.Thread(target=_pump, args=(proc.stderr, sys.stderr, tails["stderr"]))]
    for t in pumps:
        t.start()
    timed_out = False
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
    except KeyboardInterrupt:
        _kill(proc)
        raise
    if timed_out:
        _kill(proc)
    for t in pumps:
        t.join()
    return {"argv": list(argv), "returncode": proc.returncode, "timed_out": timed_out,
            "elapsed_s": time.perf_counter() - start,
            "stdout_tail": "".join(tails["stdout"]), "stderr_tail": "".join(tails["stderr"])}


def _kill(proc: subprocess.Popen) -> None:
    """Kill the child and what it started (its own session, see ``start_new_session``)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        proc.kill()
    proc.wait()


def run_benchmarks(benches: Sequence[Bench], opts: argparse.Namespace,
                   tmp: Path) -> dict[str, Any]:
    """Run each benchmark in turn; ``payloads`` of those that saved their JSON, ``runs`` (what
    ran, exit status, seconds), ``failures`` (with the stderr tail) and ``skipped``."""
    done: dict[str, Any] = {"payloads": {}, "runs": {}, "failures": {}, "skipped": {}}
    todo = [b for b in benches if b.script.exists()]
    for b in benches:
        if not b.script.exists():
            done["skipped"][b.name] = f"{b.script.relative_to(ROOT)} not found"
            print(f"skip {b.name}: {done['skipped'][b.name]}", flush=True)
    start = time.perf_counter()
    for i, bench in enumerate(todo, 1):
        out = tmp / f"{bench.name}.json"
        argv = child_argv(bench, opts, out)
        print(f"\n==== [{i}/{len(todo)}] {bench.name}: {' '.join(argv[1:])}   (report at "
              f"{time.perf_counter() - start:.0f} s)", flush=True)
        rec = run_child(argv, timeout=opts.timeout)
        payload, error = read_payload(rec, out)
        status = "ok" if error is None else f"FAILED ({error})"
        print(f"==== [{i}/{len(todo)}] {bench.name} {status} in {rec['elapsed_s']:.0f} s (report "
              f"at {time.perf_counter() - start:.0f} s)", flush=True)
        command = " ".join(["python", *argv[1:-2]])  # without the interpreter path and --out
        done["runs"][bench.name] = {"command": command, "returncode": rec["returncode"],
                                    "elapsed_s": rec["elapsed_s"], "ok": error is None}
        if error is None:
            done["payloads"][bench.name] = payload
        else:
            done["failures"][bench.name] = {
                "error": error, "returncode": rec["returncode"], "elapsed_s": rec["elapsed_s"],
                "command": command,
                "stderr_tail": rec["stderr_tail"] or rec["stdout_tail"]}
    return done


def read_payload(rec: Mapping[str, Any], out: Path) -> tuple[Any, str | None]:
    """A finished child's JSON from ``out`` and None, or None and why there is none."""
    if rec.get("timed_out"):
        return None, f"timed out after {rec['elapsed_s']:.0f} s"
    if rec["returncode"] != 0:
        return None, f"exit status {rec['returncode']}"
    try:
        return json.loads(out.read_text(encoding="utf-8")), None
    except (OSError, ValueError) as exc:
        return None, f"no JSON at {out.name}: {type(exc).__name__}: {exc}"


# ------------------------------------------------------------------------------ summary

def summarize_decode_step(p: Mapping[str, Any]) -> dict[str, Any]:
    """Median µs, speedup vs eager (ratio of medians and paired), check and first-call seconds
    per variant, as lists aligned with ``batches``."""
    batches = [r["batch"] for r in p["results"]]
    seen = dict.fromkeys(n for r in p["results"] for n in r["variants"])
    names = [n for n in VARIANT_LABELS if n in seen] + [n for n in seen if n not in VARIANT_LABELS]
    out: dict[str, Any] = {"batches": batches, "variants": names, "median_us": {},
                           "speedup_vs_eager": {}, "speedup_paired": {}, "check": {},
                           "first_call_s": {}, "x_floor": {},
                           "floor_us": [r.get("floor", {}).get("floor_us") for r in p["results"]]}
    for name in names:
        res = [r["variants"].get(name, {}) for r in p["results"]]
        out["median_us"][name] = [v.get("per_step_us", {}).get("median") for v in res]
        out["speedup_vs_eager"][name] = [v.get("speedup_vs_eager") for v in res]
        out["speedup_paired"][name] = [v.get("speedup_vs_eager_paired", {}).get("median")
                                       for v in res]
        out["check"][name] = [v.get("check", "error" if "error" in v else None) for v in res]
        out["first_call_s"][name] = [v.get("first_call_s") for v in res]
        out["x_floor"][name] = [v.get("x_floor") for v in res]
    cfg = p.get("config", {})
    out["config"] = {k: cfg.get(k) for k in ("layers", "hidden", "dtype", "device",
                                             "steps_per_round", "rounds", "quick")}
    return out


def summarize_decode_attention(p: Mapping[str, Any]) -> dict[str, Any]:
    """Per device and dtype: best kernel GB/s and fraction of copy bandwidth, speed vs SDPA."""
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for row in p.get("rows", []):
        groups.setdefault(f"{row['device']}-{row['dtype']}", []).append(row)
    out = {}
    for key, rows in groups.items():
        timed = [r for r in rows if r.get("kernel_GBps") is not None]
        vs = [r["speedup_vs_sdpa"] for r in timed if r.get("speedup_vs_sdpa") is not None]
        vb = [r["speedup_vs_blas"] for r in timed if r.get("speedup_vs_blas") is not None]
        out[key] = {"configs": len(rows),
                    "checks_ok": sum(bool(r.get("kernel_check")) for r in rows),
                    "kernel_GBps_max": max((r["kernel_GBps"] for r in timed), default=None),
                    "copy_bw_fraction_max": max((r.get("copy_bw_fraction", 0) for r in timed),
                                                default=None),
                    "read_bw_fraction_max": max((r.get("read_bw_fraction", 0) for r in timed),
                                                default=None),
                    "speedup_vs_sdpa_range": [min(vs), max(vs)] if vs else None,
                    "speedup_vs_blas_range": [min(vb), max(vb)] if vb else None}
    return out


def summarize_fusion(p: Mapping[str, Any]) -> dict[str, Any]:
    """Op level: unfused / fused ratio per pattern (min, median, max over sizes); decode step:
    paired fusion speedup per device, batch and pair, and whether the patterns fired as
    expected."""
    ratios: dict[str, list[float]] = {}
    for row in p.get("op_level", []):
        if row.get("ratio") is not None:
            ratios.setdefault(row["pattern"], []).append(row["ratio"])
    op = {k: {"cases": len(v), "min": min(v), "median": statistics.median(v), "max": max(v)}
          for k, v in sorted(ratios.items())}
    e2e: dict[str, Any] = {}
    for device, part in p.get("e2e", {}).items():
        for res in part.get("results", []):
            key = f"{device}-batch{res['batch']}"
            e2e[key] = {pair: s.get("paired", {}).get("median")
                        for pair, s in res.get("fusion_speedup", {}).items()}
            flags = [v.get("patterns_as_expected") for v in res.get("variants", {}).values()
                     if "patterns_as_expected" in v]
            e2e[key]["patterns_as_expected"] = all(flags) if flags else None
    return {"op_level_ratio": op, "e2e_fusion_speedup_paired": e2e}


def summarize_gears(p: Mapping[str, Any]) -> dict[str, Any]:
    """Per variant: traces, compile seconds, recompiles, check, per-gear median µs and speedup."""
    res = p["results"]
    gears = res["gears"]
    out: dict[str, Any] = {"gears": gears, "variants": {}}
    for name, v in res["variants"].items():
        per = v.get("per_gear", {})
        out["variants"][name] = {
            "traces": v.get("traces_total"), "compile_total_s": v.get("compile_total_s"),
            "recompiles": v.get("recompiles_after_first_pass"), "check": v.get("check"),
            "median_us": [per.get(str(g), {}).get("per_step_us", {}).get("median")
                          for g in gears],
            "speedup_vs_eager": [per.get(str(g), {}).get("speedup_vs_eager") for g in gears]}
    return out


def summarize_cache_compile(p: Mapping[str, Any]) -> dict[str, Any]:
    """Cold and warm start-up seconds, warm / cold, per-call µs of the warm process."""
    runs = p["runs"]
    out: dict[str, Any] = {}
    for key, run in runs.items():
        if isinstance(run, Mapping) and "cold" in run:
            out[key] = {"cold_s": run["cold"]["first_output_s"], "warm_s": run["warm_median_s"],
                        "warm_over_cold": run["warm_over_cold"],
                        "same_output": run["same_output"]}
    # the warm process's per-call µs: at the top of ``runs`` or in each entry
    per_call = [runs.get("overhead_us")] + [runs[key].get("overhead_us") for key in out]
    out["per_call_us"] = next((x for x in per_call if x), None)
    return out


def summarize_super_kernel(p: Mapping[str, Any]) -> dict[str, Any]:
    """Per part and variant: launches per step, median µs, paired speed vs eager, scope speedup
    (unscoped / scoped of the same engine) and check."""
    out: dict[str, Any] = {}
    for row in p["rows"]:
        out.setdefault(row["part"], {})[row["variant"]] = {
            k: row.get(k) for k in ("launches", "median_us", "vs_eager", "scope_x", "check")}
    return out


_HEADLINE_KEY = re.compile(r"launch|latency|median|speedup|segments|kernels")


def summarize_generic(p: Any, limit: int = 24) -> dict[str, Any]:
    """A payload's own ``summary`` if it has one, else up to ``limit`` scalar values whose key
    path names launches, latency, medians or speedups (for benchmarks written after this)."""
    if isinstance(p, Mapping) and isinstance(p.get("summary"), Mapping):
        return dict(p["summary"])
    found: dict[str, Any] = {}

    def walk(node: Any, path: str) -> None:
        if len(found) >= limit:
            return
        if isinstance(node, Mapping):
            for k, v in node.items():
                if k not in ("machine", "machines", "config", "args", "round_medians"):
                    walk(v, f"{path}.{k}" if path else str(k))
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{path}[{i}]")
        elif isinstance(node, (int, float)) and not isinstance(node, bool):
            if _HEADLINE_KEY.search(path.rsplit(".", 1)[-1].lower()):
                found[path] = node

    walk(p, "")
    return found


SUMMARIES: dict[str, Callable[[Any], dict[str, Any]]] = {
    "decode_step": summarize_decode_step, "decode_attention": summarize_decode_attention,
    "fusion": summarize_fusion, "gears": summarize_gears,
    "cache_compile": summarize_cache_compile, "super_kernel": summarize_super_kernel}


def summarize(payloads: Mapping[str, Any]) -> dict[str, Any]:
    """The compact summary of every payload; one that does not have the expected shape gets
    ``{"error": ...}`` instead of stopping the report."""
    out = {}
    for name, payload in payloads.items():
        try:
            out[name] = SUMMARIES.get(name, summarize_generic)(payload)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            out[name] = {"error": f"{type(exc).__name__}: {exc}"}
    return out


def merge(info: Mapping[str, Any], tag: str, command: str, opts: Mapping[str, Any],
          done: Mapping[str, Any], total_s: float | None = None) -> dict[str, Any]:
    """The report's JSON: machine, command, options, runs, failures, skipped, summary and the
    full payload of each benchmark."""
    return {"report": "bench", "machine": dict(info), "machine_tag": tag, "command": command,
            "options": dict(opts), "total_runtime_s": total_s, "runs": done["runs"],
            "failures": done["failures"], "skipped": done["skipped"],
            "summary": summarize(done["payloads"]), "benchmarks": done["payloads"]}


# ------------------------------------------------------------------------------ markdown

def machine_line(info: Mapping[str, Any]) -> str:
    parts = []
    if info.get("gpu_name"):
        parts.append(f"{info['gpu_name']} ({info.get('gpu_memory_gib')} GiB, sm "
                     f"{info.get('gpu_capability')}, CUDA {info.get('cuda')}), host")
    parts.append(f"{info.get('cpu_model')}, {info.get('nproc')} cores "
                 f"({info.get('torch_num_threads')} torch threads)")
    load = info.get("load_average_at_start")
    return (" ".join(parts) + f"; torch {info.get('torch')}, Python {info.get('python')}, "
            f"torchair {info.get('torchair')}, commit {info.get('git_commit')}, "
            f"{str(info.get('timestamp', ''))[:10]}"
            + (f"; load average {load[0]} at start" if load else ""))


def _fmt(v: Any, digits: int = 2) -> str:
    if v is None or (isinstance(v, float) and v != v):
        return "-"
    if isinstance(v, float):
        return f"{v:.0f}" if abs(v) >= 100 else f"{v:.{digits}f}"
    return str(v)


def decode_step_table(s: Mapping[str, Any]) -> list[str]:
    names = s["variants"]
    lines = ["| batch | " + " | ".join(VARIANT_LABELS.get(n, n) for n in names) + " |",
             "| ---: |" + " ---: |" * len(names)]
    for i, b in enumerate(s["batches"]):
        cells = []
        for n in names:
            med, sp = s["median_us"][n][i], s["speedup_vs_eager"][n][i]
            cells.append("-" if med is None else f"{med:.0f} ({_fmt(sp)}x)")
        lines.append(f"| {b} | " + " | ".join(cells) + " |")
    bad = [f"{n} at batch {b}: {c}" for n in names for b, c in zip(s["batches"], s["check"][n])
           if c not in ("ok", "reference")]
    compile_s = [f"{n} {_fmt(s['first_call_s'][n][0], 1)}" for n in names if n != "eager"]
    lines.append("")
    lines.append(f"First call (compile) s at batch {s['batches'][0]}: " + ", ".join(compile_s)
                 + ". Checks vs eager: " + ("; ".join(bad) if bad else "all ok") + ".")
    return lines


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def _range(lo: float, hi: float) -> str:
    return f"{lo:.2f}x" if abs(hi - lo) < 0.005 else f"{lo:.2f}-{hi:.2f}x"


def headline(name: str, s: Mapping[str, Any]) -> str:
    """One markdown list item for a benchmark other than the decode step."""
    if "error" in s and len(s) == 1:
        return f"- **{name}**: summary failed ({s['error']})"
    if name == "decode_attention":
        items = [f"{k} kernel up to {_fmt(v['kernel_GBps_max'])} GB/s "
                 f"({_fmt(v['copy_bw_fraction_max'])} of copy bw, "
                 f"{_fmt(v.get('read_bw_fraction_max'))} of read bw), vs SDPA "
                 + (_range(*v["speedup_vs_sdpa_range"]) if v["speedup_vs_sdpa_range"] else "-")
                 + (", vs BLAS path " + _range(*v["speedup_vs_blas_range"])
                    if v.get("speedup_vs_blas_range") else "")
                 + f", checks {v['checks_ok']}/{v['configs']}" for k, v in s.items()]
        return "- **decode attention**: " + "; ".join(items)
    if name == "fusion":
        op = ", ".join(f"{k} {_range(v['min'], v['max'])} (median {v['median']:.2f})"
                       for k, v in s["op_level_ratio"].items())
        e2e = ", ".join(f"{k} " + " ".join(f"{pair} {_fmt(x)}" for pair, x in v.items()
                                           if pair != "patterns_as_expected")
                        for k, v in s["e2e_fusion_speedup_paired"].items())
        expected = [v.get("patterns_as_expected") for v in s["e2e_fusion_speedup_paired"].values()]
        return (f"- **fusion**: op level unfused / fused {op or '-'}; decode step fusion speedup "
                f"(paired) {e2e or '-'}; patterns fired as expected: "
                f"{'yes' if expected and all(expected) else 'NO' if expected else '-'}")
    if name == "gears":
        items = []
        for k, v in s["variants"].items():
            sp = [x for x in v["speedup_vs_eager"] if x is not None]
            if k == "eager":
                items.append("eager " + " ".join(_fmt(x, 0) for x in v["median_us"]) + " us")
                continue
            items.append(f"{k} traces {_fmt(v['traces'])}, compile "
                         f"{_fmt(v['compile_total_s'], 1)} s, recompiles {_fmt(v['recompiles'])}"
                         + (f", vs eager {_range(min(sp), max(sp))}" if sp else "")
                         + ("" if v["check"] in ("ok", None) else f", check {v['check']}"))
        return f"- **gears** ({' '.join(map(str, s['gears']))}): " + "; ".join(items)
    if name == "cache_compile":
        items = [f"{k} cold {v['cold_s']:.1f} s, warm {v['warm_s']:.1f} s "
                 f"({100 * v['warm_over_cold']:.0f}%)" for k, v in s.items()
                 if k != "per_call_us"]
        per = s.get("per_call_us") or {}
        return ("- **compile cache** start-up: " + "; ".join(items)
                + ("; per call " + ", ".join(f"{k} {v:.0f} us" for k, v in per.items())
                   if per else ""))
    if name == "super_kernel":
        parts = []
        for part, variants in s.items():
            items = [f"{k} {_fmt(v['median_us'], 0)} us"
                     + (f", launches/step {v['launches']}" if v.get("launches") is not None
                        else "")
                     + (f", scope x {_fmt(v['scope_x'])}" if v.get("scope_x") else "")
                     + ("" if str(v.get("check")).startswith(("ok", "reference", "None"))
                        else f", check {v['check']}")
                     for k, v in variants.items()]
            parts.append(f"{part}: " + "; ".join(items))
        return "- **super kernel**: " + " | ".join(parts)
    items = [f"{k} {_fmt(v)}" for k, v in list(s.items())[:8]]
    return f"- **{name.replace('_', ' ')}**: " + ("; ".join(items) or "no headline numbers")


def render_markdown(report: Mapping[str, Any], image: str | None = None) -> str:
    """The report as markdown: machine line, decode step table, one line per other benchmark,
    failures and skips, the plot when ``image`` is given."""
    quick = report["options"].get("quick")
    lines = [f"### Benchmark report: {report['machine_tag']}"
             + (" (`--quick` smoke run: tiny models, numbers not representative)" if quick
                else ""), "",
             f"Measured on {machine_line(report['machine'])}. Command: "
             f"`{report['command']}`" + (f", {_duration(report['total_runtime_s'])}"
                                         if report.get("total_runtime_s") else "") + ".", ""]
    summary = report["summary"]
    ds = summary.get("decode_step")
    if ds and "error" not in ds:
        c = ds["config"]
        lines += [f"Decode step median latency in us (speedup vs eager); layers {c['layers']}, "
                  f"hidden {c['hidden']}, {c['dtype']}, {c['device']}, new "
                  f"`actual_seq_lengths` every call:", ""]
        lines += decode_step_table(ds) + [""]
        if image:
            lines += [f"![decode step latency vs batch]({image})", ""]
    others = [headline(n, s) for n, s in summary.items() if n != "decode_step"]
    if ds and "error" in ds:
        others.insert(0, headline("decode_step", ds))
    others += [f"- **{n}**: FAILED ({f['error']})" for n, f in report["failures"].items()]
    others += [f"- {n}: skipped ({why})" for n, why in report["skipped"].items()]
    if others:
        lines += ["Other benchmarks:", ""] + others + [""]
    return "\n".join(lines).rstrip() + "\n"


def replace_readme_block(text: str, block: str) -> str:
    """``text`` with ``block`` between the report markers. Without the markers they are added at
    the end of the ``## Benchmarks`` (or perf) section, else before ``## Layout``, else at the
    end."""
    body = f"{MARK_START}\n{block.rstrip()}\n{MARK_END}"
    start, end = text.find(MARK_START), text.find(MARK_END)
    if start >= 0 and end > start:
        return text[:start] + body + text[end + len(MARK_END):]
    if start >= 0 or end >= 0:
        raise ValueError(f"the page has only one of {MARK_START} / {MARK_END}")
    headings = [(m.start(), m.group(1)) for m in re.finditer(r"^## (.*)$", text, re.M)]
    for i, (_, title) in enumerate(headings):
        if re.search(r"bench|perf", title, re.I):
            at = headings[i + 1][0] if i + 1 < len(headings) else len(text)
            return _insert(text, at, body)
    layout = next((pos for pos, title in headings if title.lower().startswith("layout")), None)
    return _insert(text, len(text) if layout is None else layout, body)


def _insert(text: str, at: int, body: str) -> str:
    head, tail = text[:at].rstrip("\n"), text[at:]
    return head + "\n\n" + body + "\n" + ("\n" + tail if tail else "")


# ------------------------------------------------------------------------------ plot

def write_plot(report: Mapping[str, Any], path: Path) -> Path | None:
    """Decode step median latency vs batch (log-log), one line per variant; None (with a
    message) without matplotlib or without decode step results."""
    ds = report["summary"].get("decode_step")
    if not ds or "error" in ds:
        print("no plot: no decode step results")
        return None
    try:
        from matplotlib.figure import Figure
    except ImportError:
        print('no plot: matplotlib is not installed (pip install -e ".[bench]"); the JSON and '
              'markdown are written')
        return None
    info = report["machine"]
    fig = Figure(figsize=(7, 4.5))
    ax = fig.add_subplot()
    for name in ds["variants"]:
        pts = [(b, m) for b, m in zip(ds["batches"], ds["median_us"][name]) if m is not None]
        if pts:
            ax.plot(*zip(*pts), marker="o", label=VARIANT_LABELS.get(name, name),
                    linestyle="--" if name == "torchair-fx" else "-")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(ds["batches"])
    ax.set_xticklabels([str(b) for b in ds["batches"]])
    ax.set_xlabel("batch")
    ax.set_ylabel("median step latency (us)")
    where = info.get("gpu_name") or f"{info.get('cpu_model')}, {info.get('nproc')} cores"
    ax.set_title(f"decode step: {where}\ntorch {info.get('torch')}, torchair "
                 f"{info.get('torchair')}, {str(info.get('timestamp', ''))[:10]}"
                 + (" (--quick)" if report["options"].get("quick") else ""), fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path


# ------------------------------------------------------------------------------ main

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    import torch

    names = [b.name for b in BENCHES]
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cpu", "cuda"),
                   default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--quick", action="store_true", help="every benchmark's --quick smoke run")
    p.add_argument("--only", nargs="+", choices=names, metavar="NAME",
                   help=f"run only these ({', '.join(names)})")
    p.add_argument("--batch", type=int, nargs="+", default=None,
                   help=f"decode step batch sweep (default {' '.join(map(str, FULL_BATCHES))}; "
                        f"--quick {' '.join(map(str, QUICK_BATCHES))})")
    p.add_argument("--threads", type=int, default=None,
                   help="passed to the benchmarks that take --threads")
    p.add_argument("--timeout", type=float, default=3600.0,
                   help="seconds per benchmark before it is killed and recorded as failed")
    p.add_argument("--update-readme", action="store_true",
                   help="put the table between the bench-report markers of docs/benchmarks.md")
    p.add_argument("--out-dir", type=Path, default=H.RESULTS_DIR)
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda but CUDA is not available")
    if args.batch is None:
        args.batch = list(QUICK_BATCHES if args.quick else FULL_BATCHES)
    return args


def main(argv: list[str] | None = None) -> int:
    start = time.perf_counter()
    args = parse_args(argv)
    info = H.machine_info(args.device)
    tag = H.machine_tag(info) + (f"-{args.threads}thread" if args.threads else "")
    tag += "_quick" if args.quick else ""
    print("benchmark report\n" + H.format_machine(info), flush=True)
    busy = H.busy_warning(info)
    if busy:
        print(busy)
    benches = [b for b in BENCHES if not args.only or b.name in args.only]
    with tempfile.TemporaryDirectory(prefix="bench-report-") as tmp:
        done = run_benchmarks(benches, args, Path(tmp))
    opts = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    report = merge(info, tag, H.command_line(), opts, done, time.perf_counter() - start)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    json_path = H.save_json(args.out_dir / f"{tag}.json", report)
    png = write_plot(report, args.out_dir / f"{tag}.png")
    md_path = args.out_dir / f"{tag}.md"
    md_path.write_text(render_markdown(report, png.name if png else None), encoding="utf-8")
    print("\n" + render_markdown(report, None))
    if args.update_readme:
        image = (Path(os.path.relpath(png, REPORT_PAGE.parent)).as_posix()
                 if png and png.is_relative_to(ROOT) else None)
        REPORT_PAGE.write_text(replace_readme_block(REPORT_PAGE.read_text(encoding="utf-8"),
                                                    render_markdown(report, image)),
                               encoding="utf-8")
        print(f"updated {REPORT_PAGE.relative_to(ROOT)}")
    print(f"wrote {json_path}" + (f", {png}" if png else "") + f", {md_path} "
          f"(total {time.perf_counter() - start:.0f} s)")
    for name, f in done["failures"].items():
        print(f"FAILED {name}: {f['error']}\n{f['stderr_tail'][-2000:]}", file=sys.stderr)
    return 1 if done["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
