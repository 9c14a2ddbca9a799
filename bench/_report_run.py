"""Running the benchmarks for :mod:`bench.report`: which scripts it runs (:data:`BENCHES`), each
one's command line (flags its source does not define are left out), each as its own process from
the repository root with its output streamed, and its JSON read back (or why there is none).

Split out of :mod:`bench.report`, which summarizes (:mod:`bench._report_summary`) and renders
(:mod:`bench._report_page`) what these runs saved.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any, Mapping, Sequence

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
TAIL_LINES = 60


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
           Bench("gears"), Bench("cache_compile"), Bench("super_kernel"), Bench("serve"))


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
