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
* ``bench/results/<tag>_serve.png``: serving throughput (generated tokens/s) vs concurrency,
  eager and torchair (``bench_serve.py``; skipped with a message without matplotlib or without
  serve results);
* ``bench/results/<tag>.md``: the decode step table and one line per other benchmark (with both
  plots' image links), also put between the ``bench-report`` markers of ``docs/benchmarks.md``
  with ``--update-readme``.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from bench import _harness as H
from bench._report_page import render_markdown, replace_readme_block, write_plot, write_serve_plot
from bench._report_run import BENCHES, ROOT, run_benchmarks
from bench._report_summary import merge

REPORT_PAGE = ROOT / "docs" / "benchmarks.md"  # the page --update-readme rewrites
FULL_BATCHES = (1, 2, 4, 8, 16)
QUICK_BATCHES = (1, 4, 16)


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
    serve_png = write_serve_plot(report, args.out_dir / f"{tag}_serve.png")
    md_path = args.out_dir / f"{tag}.md"
    md_path.write_text(render_markdown(report, png.name if png else None,
                                       serve_png.name if serve_png else None), encoding="utf-8")
    print("\n" + render_markdown(report, None))
    if args.update_readme:
        def rel(path: Path | None) -> str | None:
            return (Path(os.path.relpath(path, REPORT_PAGE.parent)).as_posix()
                    if path and path.is_relative_to(ROOT) else None)
        REPORT_PAGE.write_text(replace_readme_block(REPORT_PAGE.read_text(encoding="utf-8"),
                                                    render_markdown(report, rel(png),
                                                                    rel(serve_png))),
                               encoding="utf-8")
        print(f"updated {REPORT_PAGE.relative_to(ROOT)}")
    print(f"wrote {json_path}" + "".join(f", {p}" for p in (png, serve_png) if p)
          + f", {md_path} (total {time.perf_counter() - start:.0f} s)")
    for name, f in done["failures"].items():
        print(f"FAILED {name}: {f['error']}\n{f['stderr_tail'][-2000:]}", file=sys.stderr)
    return 1 if done["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
