"""The pages of :mod:`bench.report`: its markdown (machine line, decode step table, one headline
per other benchmark, failures and skips), the block it puts between the ``bench-report`` markers
of a page, the decode step plot and the serving plot (matplotlib, optional).

Split out of :mod:`bench.report`; the summary these render is :mod:`bench._report_summary`.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Mapping

from bench._report_summary import VARIANT_LABELS

MARK_START = "<!-- bench-report:start -->"
MARK_END = "<!-- bench-report:end -->"


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
    if name == "serve":
        return serve_headline(s)
    items = [f"{k} {_fmt(v)}" for k, v in list(s.items())[:8]]
    return f"- **{name.replace('_', ' ')}**: " + ("; ".join(items) or "no headline numbers")


def serve_headline(s: Mapping[str, Any]) -> str:
    """The serving benchmark's line: tokens/s of each side and the ratio per concurrency."""
    c = s.get("config", {})
    tput = s["throughput_tokens_per_s"]
    items = [f"c={n} " + ("FAILED" if e is None else f"{_fmt(e, 0)} / {_fmt(t, 0)} ({_fmt(r)}x)")
             for n, e, t, r in zip(s["concurrency"], tput["eager"], tput["torchair"],
                                   s["throughput_ratio"])]
    waste = [w for w in s["padding_waste"] if w is not None]
    recompiles = [r for r in s["recompiles_after_warmup"] if r is not None]
    tokens = {True: "all equal", False: "MISMATCH", None: "-"}[s.get("tokens_ok")]
    return (f"- **serve** ({c.get('engine')} engine, {c.get('requests')} requests"
            + (f", speculate {c['speculate']}" if c.get("speculate") else "")
            + "): generated tokens/s eager / torchair " + ", ".join(items)
            + f"; tokens {tokens}; recompiles after warm-up {max(recompiles, default='-')}"
            + (f"; padding waste up to {100 * max(waste):.0f}%" if waste else ""))


def render_markdown(report: Mapping[str, Any], image: str | None = None,
                    serve_image: str | None = None) -> str:
    """The report as markdown: machine line, decode step table, one line per other benchmark,
    failures and skips, the plot when ``image`` is given and the serving plot when
    ``serve_image`` is."""
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
    if serve_image:
        lines += [f"![serving tokens/s vs concurrency]({serve_image})", ""]
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


# ------------------------------------------------------------------------------ plots

def _axes():
    """A new report figure and its axes, or None (with a message) when matplotlib is not
    installed."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        print('no plot: matplotlib is not installed (pip install -e ".[bench]"); the JSON and '
              'markdown are written')
        return None
    fig = Figure(figsize=(7, 4.5))
    return fig, fig.add_subplot()


def _plot_title(what: str, report: Mapping[str, Any]) -> str:
    info = report["machine"]
    where = info.get("gpu_name") or f"{info.get('cpu_model')}, {info.get('nproc')} cores"
    return (f"{what}: {where}\ntorch {info.get('torch')}, torchair {info.get('torchair')}, "
            f"{str(info.get('timestamp', ''))[:10]}"
            + (" (--quick)" if report["options"].get("quick") else ""))


def write_plot(report: Mapping[str, Any], path: Path) -> Path | None:
    """Decode step median latency vs batch (log-log), one line per variant; None (with a
    message) without matplotlib or without decode step results."""
    ds = report["summary"].get("decode_step")
    if not ds or "error" in ds:
        print("no plot: no decode step results")
        return None
    made = _axes()
    if made is None:
        return None
    fig, ax = made
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
    return _save(fig, ax, _plot_title("decode step", report), path)


def _save(fig, ax, title: str, path: Path) -> Path:
    """Title, grid and legend of a report plot, saved to ``path``."""
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path


def write_serve_plot(report: Mapping[str, Any], path: Path) -> Path | None:
    """Serving throughput (generated tokens/s) vs concurrency (log2 x axis), one line for eager
    and one for torchair; None (with a message) without matplotlib or without serve results."""
    sv = report["summary"].get("serve")
    if not sv or "error" in sv or not any(
            v is not None for side in sv["throughput_tokens_per_s"].values() for v in side):
        print("no serve plot: no serve results")
        return None
    made = _axes()
    if made is None:
        return None
    fig, ax = made
    labels = {"eager": "eager", "torchair": f"torchair ({sv['config'].get('engine')} engine)"}
    for side, values in sv["throughput_tokens_per_s"].items():
        pts = [(c, v) for c, v in zip(sv["concurrency"], values) if v is not None]
        if pts:
            ax.plot(*zip(*pts), marker="o", label=labels.get(side, side))
    ax.set_xscale("log", base=2)
    ax.set_xticks(sv["concurrency"])
    ax.set_xticklabels([str(c) for c in sv["concurrency"]])
    ax.set_ylim(bottom=0)
    ax.set_xlabel("concurrency (--max-batch)")
    ax.set_ylabel("generated tokens/s")
    return _save(fig, ax, _plot_title("serving", report), path)
