"""``cache_compile`` inside ``torchair run`` / ``emulate_npu()``: the emulation's device mode is a
known, repeatable TorchFunctionMode, so entries traced under it are saved and served, while an
entry built under one device mapping never serves another (none, or another device), and any
other mode is still refused.

The Ascend-style script follows seed 001's cache_compile pattern: one module, a prefill and a
decode method each wrapped in ``cache_compile``, ``forward`` choosing by the query length,
``"npu:0"`` devices, ``torch_npu`` ops. It runs twice in two processes; the second must compile
zero Dynamo graphs and return the same outputs.
"""
import json
import os
import subprocess
import sys

import pytest
import torch
from torch.overrides import TorchFunctionMode

import torchair
from torchair.compat import emulate_npu
from torchair.compat._mode import NpuDeviceMode
from torchair.inference import _cache_key as keys, cache_compile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SCRIPT = '''
import json, sys
try:
    import torch_npu  # the emulation's under `torchair run`; absent under plain python
    DEV = "npu:0"
except ImportError:
    torch_npu = None
    DEV = "cpu"
import torch
import torchair

CACHE, MODE = sys.argv[1], sys.argv[2]


def rms_norm(x, w):
    if torch_npu is not None:
        return torch_npu.npu_rms_norm(x, w)[0]
    return torch.ops.npu.npu_rms_norm(x, w)[0]


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(16, 16)
        self.norm_w = torch.nn.Parameter(torch.rand(16) + 0.5)
        fx = torchair.CompilerConfig()
        fx.debug.run_eagerly = True
        ge = MODE == "ge"
        # ge_cache: the decode step is a static unit built ahead of time (Inductor engine)
        self.cached_prefill = torchair.inference.cache_compile(
            self.prefill, config=fx, cache_dir=CACHE, ge_cache=ge)
        self.cached_decode = torchair.inference.cache_compile(
            self.decode, config=torchair.CompilerConfig() if ge else fx, cache_dir=CACHE,
            ge_cache=ge, dynamic=not ge)

    def forward(self, x, kv, pos):
        if x.size(1) > 1:
            return self.cached_prefill(x, kv)
        return self.cached_decode(x, kv, pos)

    def prefill(self, x, kv):
        h = rms_norm(self.proj(x), self.norm_w)
        kv[:, : x.size(1)] = h
        return h.sum(-1)

    def decode(self, x, kv, pos):
        h = rms_norm(self.proj(x), self.norm_w)
        kv.index_copy_(1, pos, h)
        bias = torch.ones(1, device=DEV)
        return (h * kv[:, :4].mean(1, keepdim=True)).sum(-1) + bias


torch.manual_seed(0)
model = Model().to(DEV).eval()
kv = torch.zeros(2, 8, 16, device=DEV)
prompt = torch.randn(2, 4, 16).to(DEV)
with torch.no_grad():
    outs = [model(prompt, kv, None)]
    for step in range(3):
        token = torch.randn(2, 1, 16, device=DEV)
        outs.append(model(token, kv, torch.tensor([4 + step], device=DEV)))
dynamo_before = "torch._dynamo" in sys.modules
import torch._dynamo.utils
runtime = model.cached_decode.runtime  # its served call as one generated function, once made
print(json.dumps({"outs": [o.tolist() for o in outs], "kv": kv.sum().item(),
                  "device": str(kv.device), "dynamo_imported": dynamo_before,
                  "graphs": torch._dynamo.utils.counters["stats"]["unique_graphs"],
                  "fast": runtime is not None and runtime.fast is not None}))
'''


def _run(tmp_path, *argv, emulated=True):
    script = tmp_path / "ascend_step.py"
    script.write_text(SCRIPT)
    cmd = [sys.executable, "-m", "torchair", "run", "--device", "cpu"] if emulated else \
        [sys.executable]
    env = dict(os.environ, TORCHAIR_LOG_LEVEL="INFO",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               AOT_INDUCTOR_COMPILE_WRAPPER_OPT_LEVEL="O0")  # ge_cache: a faster library build
    done = subprocess.run([*cmd, str(script), str(tmp_path / "cache"), *argv],
                          capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def _entries(tmp_path):
    return sorted(p.parent for p in (tmp_path / "cache").rglob("meta.json"))


def _check_cold_then_warm(tmp_path, mode):
    cold, cold_log = _run(tmp_path, mode)
    assert "not cached" not in cold_log, cold_log
    assert cold["graphs"] == 2 and cold_log.count("cache_compile(Model.") >= 2
    assert len(_entries(tmp_path)) == 2, cold_log
    warm, warm_log = _run(tmp_path, mode)
    assert warm["graphs"] == 0, warm_log  # Dynamo traced nothing in the warm process
    assert not warm["dynamo_imported"], warm_log  # nor was it imported before the script's print
    assert warm_log.count("loaded ") == 2 and "WARNING" not in warm_log, warm_log
    assert warm["outs"] == cold["outs"] and warm["kv"] == cold["kv"]
    assert warm["device"] == "cpu"
    return cold, warm, warm_log


@pytest.fixture(scope="module")
def fx_entries(tmp_path_factory):
    """The FX-engine script run cold and warm under `torchair run` (one cache for the module)."""
    tmp_path = tmp_path_factory.mktemp("fx")
    return (tmp_path, *_check_cold_then_warm(tmp_path, "fx"))


def test_torchair_run_warm_start_compiles_no_graph(fx_entries):
    tmp_path, cold, warm, _ = fx_entries
    assert len(cold["outs"]) == 4 and warm["outs"] == cold["outs"]
    # the last decode step went through the served call's one generated function (an FX
    # engine's unit: its own call), under the emulation's device mode, in both processes
    assert cold["fast"] and warm["fast"]


@pytest.mark.inductor
def test_torchair_run_warm_start_with_ge_cache_runs_the_library(tmp_path):
    cold, warm, warm_log = _check_cold_then_warm(tmp_path, "ge")
    assert "(from cache_compile)" in warm_log  # the decode unit: the library, not a new build
    # the last decode step went through the served call's one generated function, under the
    # emulation's device mode, in both processes (the same results: _check_cold_then_warm)
    assert cold["fast"] and warm["fast"]
    assert any((entry / "unit.so").is_file() for entry in _entries(tmp_path))


def test_an_entry_built_under_the_emulation_does_not_serve_a_plain_process(fx_entries):
    """The same script (same module, same method sources) cold under `torchair run` and then
    under plain python, where "npu" is not mapped and DEV is "cpu": the plain process must not
    be served the emulated entry; it builds (and saves) its own, and computes the same."""
    tmp_path, emulated, _, _ = fx_entries
    plain, plain_log = _run(tmp_path, "fx", emulated=False)
    assert plain["graphs"] == 2 and "loaded " not in plain_log, plain_log
    assert plain["outs"] == emulated["outs"]
    assert len(_entries(tmp_path)) == 4  # two keys: under the emulation and without


class Step(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.linear = torch.nn.Linear(8, 8)

    def step(self, x):
        return self.linear(x).relu() * 2


def _fx():
    config = torchair.CompilerConfig()
    config.debug.run_eagerly = True
    return config


def test_the_key_separates_device_mappings():
    """Cold under `--device cpu`, warm under `--device cuda` or without the emulation: three keys
    (the device mode's tag names the device playing the NPU). A user's own mode is not part of
    the key (its calls are refused by the entry's mode-stack check instead)."""
    model = Step()

    def key():
        return keys.key_hash(keys.key_parts(model.step, _fx(), True, None))

    plain = key()
    with emulate_npu("cpu"):
        on_cpu = key()
    with NpuDeviceMode("cuda"):  # the mode `torchair run --device cuda` installs
        on_cuda = key()
    with emulate_npu("cpu"):
        assert key() == on_cpu  # the same mapping, another emulation: the same key
    with NpuDeviceMode("cpu"):  # the mode alone, without the emulation's patches
        assert key() not in (plain, on_cpu)
    with _UserMode():
        assert key() == plain
    assert len({plain, on_cpu, on_cuda}) == 3


class _UserMode(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def _warnings(log):
    return [r.getMessage() for r in log if r.levelname == "WARNING"]


def test_a_served_entry_refuses_another_device_mapping_in_process(tmp_path, torchair_log):
    """Served under the emulation, then called under a device mode of another mapping (same
    depth) and with no mode at all: neither call may run the cached graph; each falls back to
    Dynamo with a warning that names the mode stack, and equals eager."""
    model = Step()
    with emulate_npu("cpu"):
        cached = cache_compile(model.step, config=_fx(), cache_dir=str(tmp_path / "c"))
        x = torch.randn(3, 8)
        with torch.no_grad():
            assert torch.equal(cached(x), model.step(x))
            assert torch.equal(cached(x + 1), model.step(x + 1))  # served from the entry
    assert not _warnings(torchair_log)
    with torch.no_grad(), NpuDeviceMode("meta"):  # another device plays the NPU
        assert torch.equal(cached(x), model.step(x))
    with torch.no_grad():
        assert torch.equal(cached(x), model.step(x))
    warnings = [w for w in _warnings(torchair_log) if "does not fit the cached graph" in w]
    assert len(warnings) == 2, _warnings(torchair_log)
    assert "TorchFunctionMode stack differs" in warnings[0] and "base='meta'" in warnings[0]
    assert "base='cpu'" in warnings[0]
    assert "TorchFunctionMode stack differs" in warnings[1] and "now no mode" in warnings[1]


def test_another_mode_under_the_emulation_is_still_refused(tmp_path, torchair_log):
    """A user's TorchFunctionMode on top of the emulation's: compiled, not cached, naming it."""
    model = Step()
    with emulate_npu("cpu"):
        cached = cache_compile(model.step, config=_fx(), cache_dir=str(tmp_path / "c"))
        x = torch.randn(3, 8)
        with torch.no_grad(), _UserMode():
            assert torch.equal(cached(x), model.step(x))
    warnings = _warnings(torchair_log)
    assert any("compiled, not cached" in w and "_UserMode" in w
               and "only torchair's torch_npu emulation mode is cacheable" in w
               for w in warnings), warnings
    assert not list((tmp_path / "c").rglob("meta.json"))


TOGETHER = '''
import json, os, sys, threading
import torch, torch.distributed as dist, torch_npu, torchair
from torchair.inference import cache_compile, set_dim_gears

local_rank = int(os.environ["LOCAL_RANK"])
torch.npu.set_device(local_rank)
dist.init_process_group("hccl")
rank = dist.get_rank()


class Layer(torch.nn.Module):
    """A row-parallel layer: each rank's half of the weight, the partial sums all-reduced."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        full = torch.randn(16, 32)
        self.w = torch.nn.Parameter(full[:, rank * 16:(rank + 1) * 16].contiguous())
        self.g = torch.nn.Parameter(torch.rand(16) + 0.5)
        config = torchair.CompilerConfig()
        config.debug.run_eagerly = True
        self.cached = cache_compile(self.decode, config=config, cache_dir=sys.argv[1],
                                    global_rank=rank, tp_rank=rank)

    def decode(self, x):
        with torchair.scope.super_kernel("sk", "stream-fusion=1"):
            y = x[..., rank * 16:(rank + 1) * 16] @ self.w.t()
        dist.all_reduce(y)
        return torch_npu.npu_rms_norm(y, self.g)[0] + torch.ones(1, device="npu")


layer = Layer().to(local_rank)  # an integer device: the NPU of this rank
outs = []
with torch.no_grad():
    for batch in (2, 4, 2):
        x = torch.randn(batch, 32, generator=torch.Generator().manual_seed(batch)).to(local_rank)
        set_dim_gears(x, {0: [2, 4]})
        outs.append(layer.cached(x).tolist())
    seen = {}

    def in_thread():  # a thread the script starts: the same emulation, the same entry
        x = torch.randn(2, 32, generator=torch.Generator().manual_seed(2)).to(local_rank)
        set_dim_gears(x, {0: [2, 4]})
        seen["out"] = layer.cached(x).tolist()

    worker = threading.Thread(target=in_thread)
    worker.start()
    worker.join(60)
dynamo = sys.modules.get("torch._dynamo")
graphs = dynamo.utils.counters["stats"]["unique_graphs"] if dynamo is not None else 0
with open(os.path.join(sys.argv[2], f"rank{rank}.json"), "w") as f:  # (not stdout: the ranks'
    json.dump({"rank": rank, "outs": outs, "thread": seen.get("out"),  # long lines interleave)
               "graphs": graphs}, f)
dist.barrier()
dist.destroy_process_group()
# a normal exit: torchair's exit drain lets gloo's workers finish before Python finalizes
'''


def test_ranks_gears_scopes_and_threads_together_warm_start(tmp_path):
    """One TorchAir-shaped script using everything at once under `torchair run --nproc-per-node
    2`: the hccl process group, per-rank cache_compile entries (global_rank, tp_rank), gears on
    the batch dim, a super_kernel scope, an all_reduce inside the graph, integer devices and a
    worker thread. Run twice: each rank of the second run compiles zero graphs, including the
    thread's call, and returns the first run's outputs."""
    script = tmp_path / "together.py"
    script.write_text(TOGETHER)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               TORCHAIR_DIST_TIMEOUT="60", TORCHAIR_LOG_LEVEL="DEBUG")
    runs = []
    for run in range(2):
        out = tmp_path / f"run{run}"
        out.mkdir()
        done = subprocess.run([sys.executable, "-m", "torchair", "run", "--nproc-per-node", "2",
                               "--device", "cpu", str(script), str(tmp_path / "cache"), str(out)],
                              capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
        rows = [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]
        runs.append(({r["rank"]: r for r in rows}, done.stderr))
        # each rank left through the exit drain (torchair.distributed.quiesce), not os._exit
        assert done.stderr.count("gloo workers quiet after") == 2, done.stderr[-4000:]
    (cold, cold_log), (warm, warm_log) = runs
    assert sorted(cold) == sorted(warm) == [0, 1]
    assert "not cached" not in cold_log and "does not fit" not in warm_log, cold_log + warm_log
    for rank in (0, 1):
        assert cold[rank]["graphs"] >= 1 and warm[rank]["graphs"] == 0, (rank, warm_log)
        assert warm[rank]["outs"] == cold[rank]["outs"]
        assert warm[rank]["thread"] == cold[rank]["thread"] == cold[rank]["outs"][0]
    assert cold[0]["outs"] == cold[1]["outs"]  # all_reduce: both ranks hold the full product
    entries = sorted(p.parent.parent.name for p in (tmp_path / "cache").rglob("meta.json"))
    assert entries == ["world2global_rank0_tp_rank0", "world2global_rank1_tp_rank1"], entries


TRANSFER = '''
import json, torch, torch_npu, torchair
from torch_npu.contrib import transfer_to_npu  # before Dynamo builds its table of torch functions


def f(x):  # eager takes the "cuda" branch (the NPU, the CPU here): compiled must take it too
    dev = "cuda" if torch.cuda.is_available() else "meta"
    return x.to(dev) + torch.cuda.device_count()


config = torchair.CompilerConfig()
config.debug.run_eagerly = True
x = torch.ones(2)
compiled = torch.compile(f, backend=torchair.get_npu_backend(compiler_config=config),
                         fullgraph=True)(x)
print(json.dumps({"eager": [str(f(x).device), f(x).tolist()],
                  "compiled": [str(compiled.device), compiled.tolist()]}))
'''


def test_transfer_to_npu_answers_the_same_compiled_as_eager(tmp_path):
    """transfer_to_npu on a CPU emulation: torch.cuda.is_available() / device_count() give the
    NPU's answers in code Dynamo traces too (they were torch's: False, and a graph break), so a
    branch on them is the same compiled as eager."""
    script = tmp_path / "transfer.py"
    script.write_text(TRANSFER)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-m", "torchair", "run", "--device", "cpu",
                           str(script)], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["eager"] == result["compiled"] == ["cpu", [2.0, 2.0]], result


def test_a_thread_started_before_the_emulation_keys_apart_from_a_plain_process():
    """A thread started before emulate_npu has no device mode on its stack, yet traces under
    the emulation's process-wide torch.device stand-in ("npu" folds to the CPU): its key and
    mode checks name the emulation, so a plain process never gets its entries (the entry's
    `torch.device("npu", 0)` raises there, as eager does)."""
    import threading

    model = Step()

    def key():
        return keys.key_parts(model.step, _fx(), True, None)["function_modes"]

    plain = key()
    keys_seen = {}
    go = threading.Event()

    def worker():
        go.wait(30)
        keys_seen["thread"] = key()

    thread = threading.Thread(target=worker)
    thread.start()
    with emulate_npu("cpu"):
        go.set()
        thread.join(30)
        main = key()
    assert plain == [] and keys_seen["thread"] != plain
    assert keys_seen["thread"] == [t for t in main if t.startswith("process: ")]
    assert main[0] in keys_seen["thread"][0]  # the same mode, seen process-wide


def test_npu_method_inside_a_cached_function_is_cached(tmp_path, torchair_log):
    """`x.npu()` and `x.to(0)` inside the cached method (Ascend code does both): Dynamo guards
    the emulated method's defaults (`torch.preserve_format`); the entry is saved and served."""
    class Move(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 4)

        def step(self, x):
            return self.linear(x.npu()) + x.to(0)

    with emulate_npu("cpu"):
        model = Move()
        cached = cache_compile(model.step, config=_fx(), cache_dir=str(tmp_path / "c"))
        x = torch.randn(2, 4)
        with torch.no_grad():
            for k in range(2):
                assert torch.equal(cached(x + k), model.step(x + k))
    assert not _warnings(torchair_log), _warnings(torchair_log)
    assert len(list((tmp_path / "c").rglob("meta.json"))) == 1
