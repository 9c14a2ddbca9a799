"""torchair.dynamo_export (issue 33): AOTInductor packages in TorchAir's layout, loaded without
the model's code.

Three AOT compiles (each 10-25 s on 2 cores): a static export shared by the module, and a 2-rank
gloo world exporting dynamically (started with the static export, so the compiles overlap); the
error tests stop before compiling. The C++ wrapper is built
at -O0 here (``aot_inductor.compile_wrapper_opt_level``), which halves its compile time.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import warnings
import zipfile
from pathlib import Path

import _export_models as models  # noqa: E402 - beside this file (pytest puts it on sys.path)
import pytest
import torch
import torch.multiprocessing as mp

import torchair
from torchair.compat import emulate_npu

pytestmark = pytest.mark.inductor

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WRAPPER_OPT = "O0"


@pytest.fixture(scope="module", autouse=True)
def _fast_wrapper():
    with torch._inductor.config.patch({"aot_inductor.compile_wrapper_opt_level": WRAPPER_OPT}):
        yield


def _inputs(b: int, s: int):
    g = torch.Generator().manual_seed(b * 100 + s)
    return torch.randn(b, s, 8, generator=g), torch.randn(b, s, 8, generator=g)


@pytest.fixture(scope="module")
def static_export(tmp_path_factory, rank_world):  # the ranks compile while this one does
    path = tmp_path_factory.mktemp("static") / "export_file"
    config = torchair.CompilerConfig()
    config.export.experimental.enable_record_nn_module_stack = True
    x, y = _inputs(2, 4)
    # exported as an Ascend script would (under `torchair run`): the emulation's device mode is
    # on the stack while Dynamo traces; the package then runs in plain processes
    with emulate_npu("cpu"):
        pkg = torchair.dynamo_export(x.npu(), y=y.to("npu:0"), scale=3,
                                     model=models.TinyModel().npu().eval(),
                                     export_path=str(path), export_name="tiny", config=config)
    return path, pkg


def _eager(x, y, scale=2):
    with torch.no_grad():
        return models.TinyModel().eval()(x, y, scale)


def test_static_export_writes_the_peer_layout(static_export):
    path, pkg = static_export
    assert sorted(os.listdir(path)) == ["dynamo.pbtxt", "tiny.pt2"]
    assert pkg == str(path / "tiny.pt2")
    text = (path / "dynamo.pbtxt").read_text()
    assert text.count('op: "Data"') == 6  # 3 weights (kind parameter), x, y, scale (constant)
    assert text.count('s: "constant"') == 1
    assert text.count('s: "parameter"') == 3 and "dim { size: -1 }" not in text
    assert '"nn_module_stack"' in text and "Block" in text  # enable_record_nn_module_stack


def test_static_package_runs_and_checks_its_inputs(static_export):
    path, _ = static_export
    loaded = torchair.load_export(path, export_name="tiny")
    assert not loaded.dynamic and loaded.device == "cpu"
    x, y = _inputs(2, 4)
    torch.testing.assert_close(loaded(x, y=y, scale=3), _eager(x, y, 3))
    with pytest.raises(ValueError, match=r"argument 0 has size 3 in dim 0, but the package was "
                                         r"compiled for 2 .*dynamic=True"):
        loaded(*_inputs(3, 4)[:1], y=y, scale=3)
    with pytest.raises(ValueError, match=r"argument 2 is 4, but the package baked in 3"):
        loaded(x, y=y, scale=4)
    with pytest.raises(ValueError, match=r"argument 0 is float16\[2, 4, 8\], but the package "
                                         r"takes float32\[2, 4, 8\]"):
        loaded(x.half(), y=y, scale=3)


_CHILD = r"""
import sys, torch, torchair
static_dir, inputs, out = sys.argv[1:]
assert not [m for m in sys.modules if "export_models" in m or "test_dynamo_export" in m]
x, y = torch.load(inputs)
static = torchair.load_export(static_dir, export_name="tiny")
result = static(x, y=y, scale=3)
assert not [m for m in sys.modules if "export_models" in m]
torch.save(result, out)
"""


def test_fresh_process_runs_the_package_without_the_model(static_export, tmp_path):
    x, y = _inputs(2, 4)
    torch.save((x, y), tmp_path / "inputs.pt")
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(static_export[0]),
                           str(tmp_path / "inputs.pt"), str(tmp_path / "out.pt")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    torch.testing.assert_close(torch.load(tmp_path / "out.pt"), _eager(x, y, 3))


# ------------------------------------------------------------------------- per-rank exports

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_world(tmp_path: Path):
    """The 2 rank processes (spawned, not joined), writing rank{r}.json into ``tmp_path``."""
    import _export_world

    env = {"AOT_INDUCTOR_COMPILE_WRAPPER_OPT_LEVEL": WRAPPER_OPT,  # read by the ranks
           # a fresh Inductor directory: what the ranks compiled there is this run's (the test
           # compares each package with its rank's directory; about 3 s more than a warm one)
           "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return mp.start_processes(_export_world.worker,
                                  args=(2, _free_port(), str(tmp_path / "export_file"),
                                        str(tmp_path)),
                                  nprocs=2, join=False, start_method="spawn")
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k)
            else:
                os.environ[k] = v


@pytest.fixture(scope="module")
def rank_world(tmp_path_factory):
    """The 2-rank gloo world, started when the module starts so its two AOT compiles overlap
    the module's own exports; the test joins it (every wait bounded)."""
    tmp_path = tmp_path_factory.mktemp("ranks")
    state = {"ctx": _start_world(tmp_path), "tmp": tmp_path,
             "export_path": tmp_path / "export_file", "joined": False,
             "factory": tmp_path_factory}
    yield state
    if not state["joined"]:
        _join(state["ctx"], deadline=_DEADLINE, out_dir=state["tmp"])


# the ranks' two AOTInductor builds share 2 cores with the module's own exports: about 30 s alone,
# past 240 s when other work loads the machine (seen twice); a hang still ends the test
_DEADLINE = 480


def _join(ctx, deadline: float, out_dir: Path | None = None) -> str | None:
    """Wait for both ranks; the first rank's reported error (the other rank is killed), a
    deadline message, or None when both finished."""
    start = time.monotonic()
    while not ctx.join(timeout=5):  # raises ProcessRaisedException when a rank failed
        failed = _rank_error(out_dir)  # a rank that caught an error exits 0: the other waits
        if failed or time.monotonic() - start > deadline:
            for p in ctx.processes:
                p.kill()
            return failed or f"the 2-rank export did not finish in {deadline} s"
    return _rank_error(out_dir)


# gloo's receive timeout inside the package's all_reduce (its wait_tensor): seen in about 1 of 3
# full-suite runs on 2 cores while each rank also ran eager's all_reduce on the default group
# between its two package calls, which can pair with the package's own (docs/export.md); the
# ranks no longer do, and the retry stays for any other stall. The rank's error names the
# wait_tensor call, or only gloo's own message.
_GLOO_TIMEOUTS = ("_c10d_functional_wait_tensor", "Timed out waiting")


def _rank_error(out_dir: Path | None) -> str | None:
    """The first rank's error written to ``rank{r}.json`` in ``out_dir``, if any."""
    for path in sorted(out_dir.glob("rank*.json")) if out_dir is not None else ():
        try:
            error = json.loads(path.read_text()).get("error")
        except ValueError:  # being written
            continue
        if error:
            return f"{path.stem} failed:\n{error}"
    return None


def test_two_rank_dynamic_export_writes_one_package_per_rank(rank_world):
    """TorchAir's multi-rank export test: rank_{r}/dynamo.pbtxt with the all_reduce, one
    package per rank; here dynamic (run at a second size) with the weights in a blob."""
    tmp_path, export_path = rank_world["tmp"], rank_world["export_path"]
    rank_world["joined"] = True
    failed = _join(rank_world["ctx"], deadline=_DEADLINE, out_dir=tmp_path)
    if failed and any(t in failed for t in _GLOO_TIMEOUTS):  # once more, in a new world; a
        # second failure fails
        warnings.warn(f"the 2-rank world timed out in gloo's all_reduce; running it once more:"
                      f"\n{failed}", stacklevel=1)  # in the run's warnings summary
        tmp_path = rank_world["factory"].mktemp("ranks_again")
        export_path = tmp_path / "export_file"
        failed = _join(_start_world(tmp_path), deadline=_DEADLINE, out_dir=tmp_path)
    assert failed is None, failed
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for rank, result in enumerate(results):
        assert "error" not in result, f"rank {rank}:\n{result['error']}"
        assert result["path"] == str(export_path / f"export{rank}.pt2")
        assert result["equal"] == [True, True] and result["weights"] == "binary_blob"
        assert result["own_group"] == [True] * 5  # eager collectives on their own group
        # Dynamo specializes sizes 0 and 1: a dynamic dim takes sizes >= 2
        assert "size 1 in dim 0, outside the exported range [2, inf]" in result["range_error"]
        assert "argument 1 has size 4 in dim 0, but argument 0 has 3" in result["equal_error"]
        with zipfile.ZipFile(result["path"]) as z:  # weights beside the .so, in the package
            blobs = [n for n in z.namelist() if n.endswith("_weights.blob")]
            assert blobs
            # compiled in the rank's own Inductor directory: the ranks' graphs have one code
            # hash, and a shared directory lets one rank package the other's files
            assert result["inductor_dir"].endswith(os.path.join("torchair_export", f"rank{rank}"))
            compiled = list(Path(result["inductor_dir"]).rglob(os.path.basename(blobs[0])))
            assert compiled and compiled[0].read_bytes() == z.read(blobs[0])
    # TorchAir: export_path/{name}{rank}.air beside rank_{rank}/dynamo.pbtxt
    assert sorted(os.listdir(export_path)) == ["export0.pt2", "export1.pt2", "rank_0", "rank_1"]
    # nothing of the packages was compiled in the shared directory
    shared = [p for p in (tmp_path / "inductor").rglob(os.path.basename(blobs[0]))
              if "torchair_export" not in p.parts]
    assert not shared, shared
    for rank in range(2):
        text = (export_path / f"rank_{rank}" / "dynamo.pbtxt").read_text()
        assert text.count('op: "_c10d_functional.all_reduce"') == 1
        assert "list { i: -1 i: 2 }" in text  # rows dynamic, columns fixed by the weight
    model = models.AllReduceModel()
    with torch.no_grad():
        for n, outs in zip((4, 3), zip(*(r["out"] for r in results))):
            torch.testing.assert_close(torch.tensor(outs[0]), model.expected(n, 2))
            assert outs[0] == outs[1]


# ------------------------------------------------------------------ what cannot be exported

@torch.library.custom_op("torchair_export_test::twice", mutates_args=())
def _twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@_twice.register_fake
def _(x):
    return torch.empty_like(x)


class _PythonOp(torch.nn.Module):
    def forward(self, x):
        return torch.ops.torchair_export_test.twice(x) + 1


class _DataDependent(torch.nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            return x + 1
        return x - 1


def test_a_rank_compiles_in_its_own_inductor_directory(monkeypatch, tmp_path):
    """Ranks export graphs of one structure (one code hash): each compiles under
    torchair_export/rank<r> of Inductor's directory, which is put back afterwards."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    from torchair.export import _export

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    seen = {}
    for rank in (0, 1):
        with _export._inductor_dir(rank):
            seen[rank] = cache_dir()
    assert seen == {r: str(tmp_path / "inductor" / "torchair_export" / f"rank{r}") for r in (0, 1)}
    assert os.path.isdir(seen[1]) and cache_dir() == str(tmp_path / "inductor")
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    with _export._inductor_dir(None):  # no process group: Inductor's own directory
        assert "torchair_export" not in cache_dir()
    with pytest.raises(RuntimeError), _export._inductor_dir(0):
        raise RuntimeError("a failed compile")
    assert "torchair_export" not in cache_dir()


def test_what_cannot_be_exported_says_why(tmp_path):
    x = torch.ones(2, 2)
    with pytest.raises(RuntimeError, match=r"all_reduce, but no process group exists.*"
                                           r"init_process_group"):
        torchair.dynamo_export(x, x, model=models.AllReduceModel(), export_path=str(tmp_path))
    with pytest.raises(RuntimeError, match=r"op torchair_export_test::twice has only Python "
                                           r"kernels.*C\+\+"):
        torchair.dynamo_export(x, model=_PythonOp(), export_path=str(tmp_path))
    with pytest.raises(RuntimeError, match=r"could not trace _DataDependent into one graph"):
        torchair.dynamo_export(x, model=_DataDependent(), export_path=str(tmp_path))
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".pt2")]
    from torchair.distributed import hcom

    assert not hcom.patched_for_hcom()  # the export's patch of the remap table is undone


def test_bad_arguments_say_what_was_expected(tmp_path):
    x = torch.ones(2, 2)
    with pytest.raises(TypeError, match=r"model must be a torch.nn.Module"):
        torchair.dynamo_export(x, model=lambda t: t, export_path=str(tmp_path))
    with pytest.raises(TypeError, match=r"config must be a torchair.CompilerConfig"):
        torchair.dynamo_export(x, model=_DataDependent(), config={}, export_path=str(tmp_path))
    os.symlink(tmp_path, tmp_path / "link")
    with pytest.raises(ValueError, match=r"export_path .* is a symbolic link"):
        torchair.dynamo_export(x, model=_DataDependent(), export_path=str(tmp_path / "link"))
    with pytest.raises(FileNotFoundError, match=r"no package 'export.pt2' in .*run dynamo_export"):
        torchair.load_export(tmp_path)
    (tmp_path / "export0.pt2").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match=r"pass rank= .*export0.pt2"):
        torchair.load_export(tmp_path)
