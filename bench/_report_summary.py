"""The compact summary of :mod:`bench.report`: per benchmark, the few numbers its page and
headline need (decode step latency per variant and batch, fusion ratios, gear traces, ...), taken
from each benchmark's saved JSON, and the report's own JSON (:func:`merge`).

Split out of :mod:`bench.report`; the page rendered from this summary is
:mod:`bench._report_page`.
"""
from __future__ import annotations

import re
import statistics
from typing import Any, Callable, Mapping

# decode step variants in table / plot order, with their labels
VARIANT_LABELS = {
    "eager": "eager",
    "inductor": "torch.compile Inductor",
    "reduce-overhead": "torch.compile reduce-overhead",
    "torchair": "torchair (Inductor engine)",
    "torchair-fx": "torchair (FX engine)",
}


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


SERVE_SIDES = ("eager", "torchair")


def summarize_serve(p: Mapping[str, Any]) -> dict[str, Any]:
    """Per concurrency (lists aligned with ``concurrency``): generated tokens/s of each side and
    their ratio, TTFT p50, TPOT p50 / p99, padding waste, token check, recompiles and compiles;
    a point whose process failed has None values and its error in ``errors``."""
    points = sorted(p["points"], key=lambda x: x["concurrency"])
    ok = [x for x in points if "error" not in x]

    def per(key: str) -> list[Any]:
        return [x.get(key) if "error" not in x else None for x in points]

    def sides(key: str) -> dict[str, list[Any]]:
        return {side: [x[key][side] if "error" not in x else None for x in points]
                for side in SERVE_SIDES}

    cfg = p.get("config", {})
    return {"concurrency": [x["concurrency"] for x in points],
            "throughput_tokens_per_s": sides("throughput_tokens_per_s"),
            "throughput_ratio": per("throughput_ratio"),
            "ttft_p50_ms": sides("ttft_p50_ms"), "tpot_p50_ms": sides("tpot_p50_ms"),
            "tpot_p99_ms": sides("tpot_p99_ms"), "padding_waste": per("padding_waste"),
            "all_tokens_equal": per("all_tokens_equal"),
            "recompiles_after_warmup": per("recompiles_after_warmup"),
            "dynamo_compiles": per("dynamo_compiles"),
            "tokens_ok": all(x["all_tokens_equal"] for x in ok) if ok else None,
            "errors": {str(x["concurrency"]): x["error"] for x in points if "error" in x},
            "config": {k: cfg.get(k) for k in ("device", "engine", "requests", "rounds",
                                               "speculate", "quick")}}


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
    "cache_compile": summarize_cache_compile, "super_kernel": summarize_super_kernel,
    "serve": summarize_serve}


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
