"""The ``torchair`` command.

    torchair run [--device cpu|cuda] script.py [args...]   # an Ascend script, unchanged
    torchair run --nproc-per-node N [--device ...] script.py [args...]
                                                           # N ranks via torch.distributed.run
    torchair demo [...]                                    # see ``torchair demo --help``

``python -m torchair ...`` is the same command.
"""
from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

__all__ = ["main"]


def _parser() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    parser = argparse.ArgumentParser(
        prog="torchair", description="TorchAir's torch.compile backend for CPU and CUDA.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = commands.add_parser(
        "run", help="run a script written for Ascend (torch_npu + TorchAir) on CPU or CUDA",
        description="Run SCRIPT as __main__ with torch_npu emulated by torchair: torch_npu.npu_* "
                    "are torchair's ops; 'npu' devices, .npu() and torch.npu (streams, events, "
                    "seeds, memory queries) are the chosen device's.")
    run.add_argument("--device", choices=("cpu", "cuda"), default=None,
                     help="the device that plays the NPU (default: cuda when available, else cpu)")
    run.add_argument("--nproc-per-node", "--nproc_per_node", dest="nproc_per_node", type=int,
                     default=1, metavar="N",
                     help="start N ranks on this host with torch.distributed.run (standalone "
                          "rendezvous), each running SCRIPT under the emulation; "
                          "backend='hccl' is gloo on cpu, nccl on cuda (default: 1, no launcher)")
    run.add_argument("--master-port", "--master_port", dest="master_port", type=int,
                     default=None, metavar="PORT",
                     help="with --nproc-per-node N > 1: the rendezvous port (default: a free one)")
    run.add_argument("script", help="path of the Python script")
    run.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to the script")
    commands.add_parser("demo", add_help=False, help="torchair's demo (arguments go to it; "
                        "see torchair demo --help)")
    return parser, run


def _demo(argv: list[str]) -> int:
    try:
        from torchair import demo
    except ModuleNotFoundError as err:
        if err.name not in ("torchair.demo", "torchair"):
            raise
        print("torchair demo: error: torchair.demo is not part of this installation",
              file=sys.stderr)
        return 2
    return demo.main(argv) or 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``torchair`` / ``python -m torchair``; returns the exit code.

    Argument errors (unknown command, missing script) exit with code 2; an exception raised by
    the script propagates, as it would under ``python script.py``.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["demo"]:  # everything after "demo" belongs to the demo's own parser
        return _demo(argv[1:])
    parser, run = _parser()
    ns = parser.parse_args(argv)
    if not os.path.isfile(ns.script):
        run.error(f"cannot run {ns.script!r}: no such file")
    if ns.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            run.error("--device cuda: CUDA is not available here; use --device cpu")
    if ns.nproc_per_node < 1:
        run.error(f"--nproc-per-node {ns.nproc_per_node}: expected a number of ranks >= 1")
    if ns.nproc_per_node > 1:
        return _launch(ns)
    if ns.master_port is not None:
        run.error("--master-port is only used with --nproc-per-node N > 1")
    from torchair.compat import run_script

    if "TORCHELASTIC_RUN_ID" in os.environ:  # a rank started by torch.distributed.run
        from torch.distributed.elastic.multiprocessing.errors import record

        # records the rank's exception for the launcher's failure summary, then re-raises it
        record(run_script)(ns.script, ns.args, device=ns.device)
    else:
        run_script(ns.script, ns.args, device=ns.device)
    return 0


def _launch(ns: argparse.Namespace) -> int:
    """Start ``ns.nproc_per_node`` ranks with torch.distributed.run, each one
    ``python -m torchair run --device D script args``; returns the launcher's exit status."""
    import torch
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    device = ns.device or ("cuda" if torch.cuda.is_available() else "cpu")
    launcher = ["--nproc-per-node", str(ns.nproc_per_node)]
    if ns.master_port is None:
        launcher.append("--standalone")
    else:  # a single-node static rendezvous on the given port
        launcher += ["--nnodes", "1", "--master-addr", "127.0.0.1",
                     "--master-port", str(ns.master_port)]
    argv = [*launcher, "--module", "torchair", "run", "--device", device, ns.script, *ns.args]
    try:
        torchrun.main(argv)
    except ChildFailedError as err:
        print(f"torchair run: {err}", file=sys.stderr)
        return 1
    return 0
