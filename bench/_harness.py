"""Shared helpers for the benchmarks under ``bench/``: machine description, interleaved timing,
summary statistics, a plain-text table and JSON output.

Timing model: every variant is a callable ``fn(step)`` that runs one step. A *round* runs all
steps of one variant back to back, timing each call separately (``time.perf_counter``, with
``torch.cuda.synchronize()`` after the call on CUDA). Rounds are interleaved: round ``r`` runs
every variant once, starting at variant ``r mod n`` so that no variant always goes first or always
follows the same neighbour. Speed ratios are therefore measured side by side, in one process, under
the same machine load; comparing numbers across runs or machines is not meaningful.
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime
import gc
import json
import os
import platform
import re
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import torch

from torchair.demo.roofline import balanced_orders

BENCH_DIR = Path(__file__).resolve().parent
RESULTS_DIR = BENCH_DIR / "results"


# ------------------------------------------------------------------------------ machine

def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.lower().startswith(("model name", "hardware", "cpu model")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=BENCH_DIR,
                             capture_output=True, text=True, timeout=5, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=BENCH_DIR, capture_output=True, text=True, timeout=5)
        return out.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def load_average() -> list[float] | None:
    """1/5/15-minute load averages (other processes on the machine skew CPU timings)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def machine_info(device: str) -> dict[str, Any]:
    """What the numbers were measured on: platform, CPU, thread count, versions, GPU."""
    try:
        import torchair
        torchair_version = getattr(torchair, "__version__", "unknown")
    except ImportError:
        torchair_version = None
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_model": _cpu_model(),
        "nproc": _usable_cpus(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "torch_num_threads": torch.get_num_threads(),
        "torchair": torchair_version,
        "git_commit": _git_commit(),
        "device": device,
        "load_average_at_start": load_average(),
        "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    if device == "cuda" and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        info.update({
            "gpu_name": props.name,
            "gpu_memory_gib": round(props.total_memory / 2**30, 1),
            "gpu_capability": f"{props.major}.{props.minor}",
            "cuda": torch.version.cuda,
        })
    return info


def busy_warning(info: Mapping[str, Any]) -> str | None:
    """A warning when other processes keep the CPU busy: with several torch threads, each
    OpenMP parallel region then waits for a descheduled thread, and CPU per-step times can grow
    tenfold, in proportion to the number of parallel regions rather than to the work."""
    load = info.get("load_average_at_start")
    if info.get("device") != "cpu" or not load:
        return None
    if load[0] < 0.5 * info.get("nproc", 1):
        return None
    return (f"WARNING: load average {load[0]} on {info['nproc']} CPUs before the run: other "
            f"processes compete for the CPUs; with {info['torch_num_threads']} torch threads the "
            f"timings measure OpenMP waits as much as the code (try --threads 1 or a quiet "
            f"machine)")


def print_machine(info: Mapping[str, Any]) -> None:
    """Print the machine (:func:`format_machine`) and, when it is busy, the warning saying so."""
    print(format_machine(info))
    warning = busy_warning(info)
    if warning:
        print(warning)


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def machine_tag(info: Mapping[str, Any]) -> str:
    """A short file-name tag: ``cpu-2core`` on CPU, the GPU name slug on CUDA."""
    if info.get("device") == "cuda" and info.get("gpu_name"):
        return _slug(str(info["gpu_name"]))
    return f"cpu-{info.get('nproc', os.cpu_count())}core"


def format_machine(info: Mapping[str, Any]) -> str:
    lines = [f"platform : {info['platform']} (python {info['python']})",
             f"cpu      : {info['cpu_model']}, nproc {info['nproc']}, "
             f"torch threads {info['torch_num_threads']}, load average "
             f"{info.get('load_average_at_start')}",
             f"torch    : {info['torch']}   torchair {info['torchair']}   "
             f"commit {info.get('git_commit')}"]
    if info.get("gpu_name"):
        lines.append(f"gpu      : {info['gpu_name']} ({info['gpu_memory_gib']} GiB, "
                     f"sm {info['gpu_capability']}, CUDA {info['cuda']})")
    return "\n".join(lines)


# ------------------------------------------------------------------------------ timing

def synchronizer(device: str) -> Callable[[], None]:
    """``torch.cuda.synchronize`` on CUDA, a no-op elsewhere."""
    if str(device).startswith("cuda"):
        return torch.cuda.synchronize
    return lambda: None


def device_time_us(fn: Callable[[int], Any], reps: int = 20, trials: int = 5) -> float | None:
    """GPU microseconds per ``fn(0)`` call: ``reps`` calls captured in one CUDA graph, its
    replay timed with CUDA events (median of ``trials``). What the kernels themselves take,
    without the host's launch and synchronize costs that a per-call wall time includes (on the
    first lent H200 those were 0.4 ms a call). None when the calls cannot be captured (a host
    synchronization inside); the error is printed."""
    import statistics

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    try:
        with torch.cuda.stream(stream):
            fn(0)  # compiled / allocated outside the capture
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(reps):
                fn(0)
        graph.replay()
        torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001 - a call that cannot be captured: no device time
        torch.cuda.synchronize()
        print(f"  (no device time: {type(exc).__name__}: {exc})".splitlines()[0])
        return None
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(trials):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / reps)
    return statistics.median(times)


def time_calls(fn: Callable[[int], Any], steps: Sequence[int],
               sync: Callable[[], None]) -> list[float]:
    """Seconds of each ``fn(step)`` call, synchronized, in order."""
    times = []
    perf = time.perf_counter
    for step in steps:
        sync()
        start = perf()
        fn(step)
        sync()
        times.append(perf() - start)
    return times


@contextlib.contextmanager
def frozen_heap(collector_off: bool = False) -> Iterator[None]:
    """Collect once and freeze what is left (``gc.freeze``: later collections skip it), for timed
    loops that collect between rounds; with ``collector_off`` the collector is also off inside.
    Afterwards the objects frozen here are unfrozen and the collector is on or off as before. A
    caller's own freeze is kept (nothing is frozen or unfrozen here then)."""
    enabled, own = gc.isenabled(), gc.get_freeze_count() == 0
    if own:
        gc.collect()
        gc.freeze()
    if collector_off:
        gc.disable()
    try:
        yield
    finally:
        if own:
            gc.unfreeze()
        (gc.enable if enabled else gc.disable)()


def interleaved_rounds(variants: Mapping[str, Callable[[int], Any]],
                       steps_of_round: Callable[[int], Sequence[int]], rounds: int,
                       sync: Callable[[], None], *,
                       before_round: Callable[[str, int], None] | None = None,
                       after_round: Callable[[str, int], None] | None = None,
                       collect_garbage: bool = True) -> dict[str, list[list[float]]]:
    """Per-step seconds of every variant, ``result[name][round][i]``.

    Round ``r`` runs ``fn(step)`` for each step in ``steps_of_round(r)``, for every variant, in
    the order ``balanced_orders`` gives round ``r`` (over a whole cycle of its orders, each
    variant at each place, and right after each other variant, equally often).
    ``before_round``/``after_round`` run outside the timed region (for bookkeeping such as
    recompile counters).

    With ``collect_garbage`` the heap is collected and frozen once (:func:`frozen_heap`); the
    collector is off during each variant's round and collects before it, skipping the frozen
    objects. A full collection of the whole process before every round, as before, took some
    250 ms after an Inductor compile (100 s in a run) and evicted every cache ahead of each
    round's first step; a serving loop does not do that.
    """
    names = list(variants)
    orders = balanced_orders(len(names))
    result: dict[str, list[list[float]]] = {name: [] for name in names}
    with frozen_heap() if collect_garbage else contextlib.nullcontext():
        for r in range(rounds):
            steps = list(steps_of_round(r))
            for k in orders[r % len(orders)]:
                name = names[k]
                if before_round is not None:
                    before_round(name, r)
                enabled = gc.isenabled()
                if collect_garbage:
                    gc.collect()
                    gc.disable()
                try:
                    result[name].append(time_calls(variants[name], steps, sync))
                finally:
                    if collect_garbage and enabled:
                        gc.enable()
                if after_round is not None:
                    after_round(name, r)
    return result


def add_unit_bench_options(p: Any, benchmark: str) -> None:
    """``--quick``, ``--engine`` and ``--out`` of the benches that time the bench decoder's launch
    units (``bench_cached_call``, ``bench_after_pause``, ``bench_host_cold``) on argparse parser
    ``p``."""
    p.add_argument("--quick", action="store_true", help="tiny model, few rounds (smoke test)")
    p.add_argument("--engine", choices=("inductor", "fx"), default="inductor",
                   help="the units' engine (fx: debug.run_eagerly, no C++ compile; tests)")
    p.add_argument("--out", default=None,
                   help=f"JSON path (default results/{benchmark}_<tag>.json)")


def open_unit_bench(args: Any) -> tuple[float, dict[str, Any], tuple]:
    """The opening of a unit bench's ``main`` (:func:`add_unit_bench_options`' benches): its start
    time (``time.perf_counter``, for :func:`save_unit_bench`), the machine info (printed) and the
    bench decoder for ``args.quick`` / ``args.batch`` (``bench.model.host_bench_decoder``:
    config, model, initial KV caches)."""
    from bench.model import host_bench_decoder

    start = time.perf_counter()
    info = machine_info("cpu")
    print_machine(info)
    return start, info, host_bench_decoder(args.quick, args.batch)


def save_unit_bench(benchmark: str, args: Any, info: dict[str, Any], model: Any, start: float,
                    config: dict[str, Any], results: dict[str, Any]) -> None:
    """Save the JSON of a bench that times the bench decoder's launch units (``bench_cached_call``,
    ``bench_after_pause``, ``bench_host_cold``): the command, the machine ``info``, the config
    (``--batch``, the bench's own ``config``, the model config ``model``, ``--engine``), the
    ``results`` and the run time since ``start`` (``time.perf_counter``), where
    :func:`add_unit_bench_options`' ``--out`` / ``--quick`` say."""
    payload = {"benchmark": benchmark, "command": command_line(), "machine": info,
               "config": {"batch": args.batch, **config, "model": dataclasses.asdict(model),
                          "engine": args.engine},
               **results, "total_runtime_s": time.perf_counter() - start}
    save_results(benchmark, machine_tag(info), payload, quick=args.quick, out=args.out)


def record_failure(result: dict[str, Any], name: str, exc: BaseException) -> None:
    """Record in a variant's ``result`` that it failed (error, traceback, not to be timed) and
    say so; called from the ``except`` block, so the traceback is the exception's."""
    result["error"] = f"{type(exc).__name__}: {exc}"
    result["traceback"] = traceback.format_exc()
    result["ok_to_time"] = False
    print(f"  {name}: FAILED: {result['error'].splitlines()[0][:300]}", flush=True)


def unique_graphs() -> int:
    """How many distinct graphs Dynamo has compiled in this process so far."""
    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])


class RecompileRounds:
    """Recompiles per variant during :func:`interleaved_rounds` (its round hooks): ``counts``
    maps each variant name to the graphs Dynamo compiled inside that variant's timed rounds."""

    def __init__(self, names: Sequence[str]) -> None:
        self.counts: dict[str, int] = {name: 0 for name in names}
        self._marks: dict[str, int] = {}

    def before_round(self, name: str, r: int) -> None:
        self._marks[name] = unique_graphs()

    def after_round(self, name: str, r: int) -> None:
        self.counts[name] += unique_graphs() - self._marks[name]


def round_steps(first: int, steps: int) -> Callable[[int], range]:
    """``steps_of_round`` for :func:`interleaved_rounds`: round ``r`` times ``steps`` steps from
    ``first + r * steps``."""
    return lambda r: range(first + r * steps, first + (r + 1) * steps)


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile ``q`` in [0, 100] of already sorted values."""
    if not sorted_values:
        return float("nan")
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def summarize(rounds: Sequence[Sequence[float]], scale: float = 1e6) -> dict[str, Any]:
    """Median / p10 / p90 / mean / min of all per-step times (seconds, reported x ``scale``;
    default microseconds) plus the median of each round, to show round-to-round drift."""
    flat = sorted(t for rnd in rounds for t in rnd)
    per_round = [percentile(sorted(rnd), 50) * scale for rnd in rounds if rnd]
    return {
        "n": len(flat),
        "median": percentile(flat, 50) * scale,
        "p10": percentile(flat, 10) * scale,
        "p90": percentile(flat, 90) * scale,
        "mean": (sum(flat) / len(flat) * scale) if flat else float("nan"),
        "min": (flat[0] * scale) if flat else float("nan"),
        "round_medians": per_round,
    }


def paired_ratios(baseline: Sequence[Sequence[float]],
                  other: Sequence[Sequence[float]]) -> dict[str, Any]:
    """Per-round speedup ``median(baseline round r) / median(other round r)``.

    Both ran in the same round, close together in time, so a change of machine load between
    rounds (other processes) affects both; the median of these ratios is steadier than the ratio
    of the overall medians when the load fluctuates."""
    ratios = sorted(percentile(sorted(b), 50) / percentile(sorted(o), 50)
                    for b, o in zip(baseline, other) if b and o)
    return {"n_rounds": len(ratios), "median": percentile(ratios, 50),
            "p10": percentile(ratios, 10), "p90": percentile(ratios, 90)}


# ------------------------------------------------------------------------------ output

def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain-text table; numbers are right-aligned."""
    cells = [[str(h) for h in headers]] + [[_cell(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    numeric = [any(_is_number(row[i]) for row in rows)
               and all(_is_number(row[i]) or row[i] is None for row in rows)
               for i in range(len(headers))]

    def line(row: Sequence[str]) -> str:
        return "  ".join(c.rjust(w) if numeric[i] else c.ljust(w)
                         for i, (c, w) in enumerate(zip(row, widths))).rstrip()

    out = [line(cells[0]), line(["-" * w for w in widths])]
    out += [line(r) for r in cells[1:]]
    return "\n".join(out)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _cell(v: Any) -> str:
    if isinstance(v, float):
        if v != v:  # nan
            return "-"
        return f"{v:.2f}" if abs(v) < 100 else f"{v:.0f}"
    return "-" if v is None else str(v)


def save_json(path: str | os.PathLike, payload: Any) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(payload, f, indent=2, sort_keys=False, default=_json_default)
        f.write("\n")
    return path


def save_results(benchmark: str, tag: str, payload: dict[str, Any], *, quick: bool = False,
                 out: str | os.PathLike | None = None) -> Path:
    """Save a run to ``out`` or ``results/<benchmark>_<tag>[_quick].json`` and say where, with
    ``payload["total_runtime_s"]`` when it is set."""
    path = save_json(out or RESULTS_DIR / f"{benchmark}_{tag}{'_quick' if quick else ''}.json",
                     payload)
    total = payload.get("total_runtime_s")
    print(f"\nsaved {path}" + (f" (total {total:.0f} s)" if total is not None else ""))
    return path


def _json_default(obj: Any) -> Any:
    if isinstance(obj, (torch.dtype, torch.device)):
        return str(obj)
    if isinstance(obj, Path):
        return str(obj)
    return repr(obj)


def command_line() -> str:
    """The command that started this process, as typed: ``python -m bench.<module> ...`` for a
    module run with ``-m`` (``sys.argv[0]`` is then the module's file path)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and spec.name:
        return " ".join([Path(sys.executable).name, "-m", spec.name] + sys.argv[1:])
    return " ".join([Path(sys.executable).name] + sys.argv)
