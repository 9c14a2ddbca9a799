"""cache_compile is never stale: one cold process, then warm processes that each change one thing.

Every warm result must equal eager; a warm process that does not serve the call from the entry
must say so (a fallback warning naming the failed guard, or a stale/rebuilt entry). The changes
cover every guard kind Dynamo emits on this model (module int/float attributes, module globals,
``self.training``, an int branch, a float in a dict, tensor strides / storage offset / dtype /
requires_grad), a source line (the model and a helper in another file), a config option and gears.
"""
import concurrent.futures
import json
import os
import subprocess
import sys
import textwrap

import torch

HELPER = '''
def act(y):
    return y.relu() + 0.25
'''

MODEL = '''
import contextlib
import json
import sys

import torch
import torchair
from torchair.inference import set_dim_gears

import prop_helper

SCALE = 2.0
OFFSET = 1
BIAS = torch.linspace(-1, 1, 8)


class Model(torch.nn.Module):
    def __init__(self, cache_dir, config):
        super().__init__()
        torch.manual_seed(0)
        self.l = torch.nn.Linear(8, 8)
        self.n = 3
        self.f = 0.5
        self.scales = [1.0, 2.0]
        self.cached = torchair.inference.cache_compile(self.step, cache_dir=cache_dir,
                                                       config=config)
        self.cached_gears = torchair.inference.cache_compile(self.gear_step, cache_dir=cache_dir,
                                                             config=config, dynamic=False)

    def step(self, x, k: int, opts: dict):
        y = self.l(x) * self.n + self.f
        if self.training:
            y = y * 2
        if k > 2:
            y = y + 1
        y = prop_helper.act(y * opts["alpha"] + BIAS - opts["shift"]) * self.scales[1]
        return y * SCALE + OFFSET

    def gear_step(self, x):
        return self.l(x).sum(-1) * self.n


class Passthrough(torch.overrides.TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def main(cache_dir, change, functions, same_process=""):
    config = torchair.CompilerConfig()
    config.debug.run_eagerly = True
    if change == "config":
        config.experimental_config.pattern_fusion_pass = False
    g = globals()
    m = Model(cache_dir, config).eval()
    torch.manual_seed(1)
    x, k, opts = torch.randn(4, 8), 3, {"alpha": 1.5, "shift": torch.full((8,), 0.5)}
    gx = [torch.randn(2, 8), torch.randn(4, 8)]
    gears = {0: [2, 4]}
    mode = contextlib.nullcontext()
    if same_process:  # the cold call and a served one in this process; then the change
        with torch.no_grad():
            for _ in range(2):
                if functions in ("main", "all"):
                    m.cached(x, k, opts)
                for t in gx if functions in ("gears", "all") else ():
                    t = t.clone()  # the tensors of the later call get their own gear marks
                    set_dim_gears(t, gears)
                    m.cached_gears(t)
    if change == "int_attr":
        m.n = 5
    elif change == "float_attr":
        m.f = 0.75
    elif change == "list_float":
        m.scales[1] = 3.0
    elif change == "list_length":
        m.scales.append(4.0)
    elif change == "global_int":
        g["OFFSET"] = 4
    elif change == "global_float":
        g["SCALE"] = 3.0
    elif change == "global_tensor":
        g["BIAS"] = torch.linspace(1, 2, 8)
    elif change == "aliasing":
        opts["shift"] = BIAS  # the same tensor twice: Dynamo guards that inputs are distinct
    elif change == "training":
        m.train()
    elif change == "int_branch":
        k = 1
    elif change == "int_same_branch":
        k = 7
    elif change == "dict_float":
        opts["alpha"] = 0.25
    elif change == "dict_int":
        opts["alpha"] = 2
    elif change == "swap_function":
        prop_helper.act = lambda y: y.sigmoid()
    elif change == "instance_forward":
        m.l.forward = lambda t: t * 2
    elif change == "strides":
        x = torch.randn(8, 4).t()
    elif change == "storage_offset":
        x = torch.randn(5, 8)[1:]
    elif change == "dtype":
        x = x.double()
        m.double()
        g["BIAS"] = BIAS.double()
        opts["shift"] = opts["shift"].double()
    elif change == "input_dtype":
        opts["shift"] = opts["shift"].double()
    elif change == "requires_grad":
        x.requires_grad_()
    elif change == "batch":
        x = torch.randn(6, 8)
    elif change == "mark_static":
        torchair.inference.mark_static(x)
    elif change == "mark_dynamic":
        torch._dynamo.mark_dynamic(x, 0)
    elif change == "deterministic":
        torch.use_deterministic_algorithms(True)
    elif change == "function_mode":
        mode = Passthrough()
    elif change == "default_device":
        mode = torch.device("cpu")
    elif change == "gears_other":
        gears, gx = {0: [2, 3]}, [torch.randn(2, 8), torch.randn(3, 8)]
    elif change == "gears_none":
        gears = None
    elif change not in ("none", "source_model", "source_helper", "config"):
        raise SystemExit(f"unknown change {change}")
    results = []
    with torch.no_grad():
        if functions in ("main", "all"):
            with mode:
                out = m.cached(x, k, opts)
            results.append((out, m.step(x, k, opts)))
        for t in gx if functions in ("gears", "all") else ():
            if gears is not None:
                set_dim_gears(t, gears)
            results.append((m.cached_gears(t), m.gear_step(t)))
    dynamo = sys.modules.get("torch._dynamo")
    frames = dynamo.utils.counters["stats"]["unique_graphs"] if dynamo is not None else 0
    print(json.dumps({
        "equal": [bool(torch.equal(a, b)) for a, b in results],
        "dynamo_frames": frames,
        "dynamo_imported": dynamo is not None,
    }))


if __name__ == "__main__":
    main(*sys.argv[1:])
'''

# change -> (functions it calls, what the warm process must do besides returning eager's result):
#   "serve": run from the entry, no fallback, no Dynamo frame;
#   "fallback": warn that the call does not fit the cached graph (and compile it);
#   "either": serving and falling back are both right (Dynamo would retrace, same graph);
#   "rebuild": find the entry stale or use another key (compile, never replay the old graph).
CHANGES = {
    "none": ("main", "serve"),
    "int_attr": ("main", "fallback"),
    "float_attr": ("main", "serve"),  # floats reach the graph as inputs (unspecialized)
    "list_float": ("main", "serve"),
    "list_length": ("main", "fallback"),
    "global_int": ("main", "fallback"),
    "global_float": ("main", "serve"),
    "global_tensor": ("main", "serve"),  # a tensor global is a graph input
    "aliasing": ("main", "fallback"),
    "training": ("main", "fallback"),
    "int_branch": ("main", "fallback"),
    "int_same_branch": ("main", "serve"),  # dynamic=True: k is a symbol guarded 3 <= k
    "dict_float": ("main", "serve"),
    "dict_int": ("main", "fallback"),
    "swap_function": ("main", "fallback"),
    "instance_forward": ("main", "fallback"),
    "strides": ("main", "fallback"),
    "storage_offset": ("main", "either"),
    "dtype": ("main", "rebuild"),  # the parameters' dtype is part of the key
    "input_dtype": ("main", "fallback"),
    "requires_grad": ("main", "fallback"),
    "batch": ("main", "serve"),  # dynamic=True: the entry's symbolic shapes admit batch 6
    "mark_static": ("main", "either"),
    "mark_dynamic": ("main", "either"),
    "deterministic": ("main", "fallback"),
    "function_mode": ("main", "fallback"),
    "default_device": ("main", "fallback"),
    "gears_other": ("gears", "fallback"),
    "gears_none": ("gears", "fallback"),
    "config": ("gears", "rebuild"),
    "source_helper": ("main", "rebuild"),
    "source_model": ("gears", "rebuild"),
}

# Every guard kind Dynamo emits for these two functions, and the changes that make it fail (or
# show it does not matter). A kind a newer Dynamo adds fails the test until a change covers it.
COVERED_KINDS = {
    "TENSOR_MATCH": ("strides", "input_dtype", "requires_grad", "batch"),
    "TYPE_MATCH": ("dict_int",),
    "EQUALS_MATCH": ("int_attr", "global_int"),
    "FALSE_MATCH": ("training",),
    "LENGTH_CHECK": ("list_length",),
    "ID_MATCH": ("swap_function",),
    "DICT_CONTAINS": ("instance_forward",),
    "NO_TENSOR_ALIASING": ("aliasing",),
    "LAMBDA_GUARD": ("int_branch", "int_same_branch"),
    "GLOBAL_STATE": ("deterministic",),
    "TORCH_FUNCTION_MODE_STACK": ("function_mode",),
    "DEFAULT_DEVICE": ("default_device",),
    "DIMENSION_DYNAMIC_MARKING_GUARD": ("mark_static", "gears_none"),
    "NO_HASATTR": ("mark_dynamic",),  # torch 2.11: hasattr(x, '_dynamo_dynamic_indices') == False
}


def _write(tmp_path):
    (tmp_path / "prop_helper.py").write_text(textwrap.dedent(HELPER))
    (tmp_path / "prop_model.py").write_text(textwrap.dedent(MODEL))


def _run(tmp_path, change, functions=None, same_process=False, guards="arguments"):
    functions = functions or CHANGES[change][0]
    path = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, TORCHAIR_LOG_LEVEL="INFO", PYTHONPATH=path,
               TORCHAIR_CACHE_GUARDS=guards)
    cache = tmp_path / (f"same-{guards}-{change}" if same_process else "c")
    extra = ["same"] if same_process else []
    done = subprocess.run([sys.executable, str(tmp_path / "prop_model.py"), str(cache),
                           change, functions, *extra], capture_output=True, text=True,
                          timeout=300, env=env, cwd=tmp_path)
    assert done.returncode == 0, f"{change}: {done.stdout}\n{done.stderr}"
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["log"] = done.stderr
    return change, result


def _warnings(log):
    return [line for line in log.splitlines() if line.startswith("[torchair WARNING]")]


def _check(change, result):
    log = result["log"]
    assert result["equal"] and all(result["equal"]), f"{change}: warm result differs from eager"
    functions, expected = CHANGES[change]
    calls = 2 if functions == "gears" else 1
    fell_back = [w for w in _warnings(log) if "does not fit the cached graph" in w]
    if expected == "serve":
        assert not _warnings(log), f"{change}: {_warnings(log)}"
        assert log.count("loaded ") == 1, f"{change}: {log}"
        assert result["dynamo_frames"] == 0, f"{change}: Dynamo traced a frame"
    elif expected == "fallback":
        assert fell_back, f"{change}: served without a fallback warning:\n{log}"
        assert result["dynamo_frames"] >= 1, f"{change}: {result}"
    elif expected == "either":
        assert not result["dynamo_frames"] or fell_back, f"{change}: silent retrace\n{log}"
    else:
        assert "loaded " not in log, f"{change}: the old entry served the call\n{log}"
        assert "stale" in log or log.count("saved ") == 1, f"{change}: {log}"
    assert len(result["equal"]) == calls


def test_warm_processes_each_changing_one_thing_never_return_stale_results(tmp_path):
    _write(tmp_path)
    _, cold = _run(tmp_path, "none", "all")
    assert cold["equal"] == [True] * 3 and cold["log"].count("saved ") == 2, cold["log"]
    entries = sorted((tmp_path / "c").rglob("meta.json"))
    assert len(entries) == 2
    kinds = {g["kind"] for e in entries for g in json.loads(e.read_text())["guards"]}
    assert kinds <= set(COVERED_KINDS), f"no change covers {kinds - set(COVERED_KINDS)}"
    assert all(c in CHANGES for cs in COVERED_KINDS.values() for c in cs)

    parallel = [c for c in CHANGES if not c.startswith("source_")]
    with concurrent.futures.ThreadPoolExecutor(max_workers=3) as pool:
        results = dict(pool.map(lambda c: _run(tmp_path, c), parallel))
    failed = []
    for change in parallel:
        try:
            _check(change, results[change])
        except AssertionError as error:
            failed.append(str(error))
    assert not failed, "\n\n".join(failed)
    named = {"int_attr": "L['self'].n == 3", "training": "L['self'].training == False",
             "strides": "stride=[8, 1]", "gears_other": "gears {0: (2, 3)}"}
    for change, text in named.items():
        assert any(text in w for w in _warnings(results[change]["log"])), (change, text)

    # these change the sources: run one after another, on the entries above
    helper = tmp_path / "prop_helper.py"
    helper.write_text(helper.read_text().replace("+ 0.25", "+ 0.5"))
    _check(*_run(tmp_path, "source_helper"))
    model = tmp_path / "prop_model.py"
    model.write_text(model.read_text().replace(".sum(-1) * self.n", ".sum(-1) * self.n + 1"))
    _check(*_run(tmp_path, "source_model"))


def test_gear_entry_serves_every_gear_in_a_new_process(tmp_path):
    """One unit per gear: a warm process runs both gears of the entry without a Dynamo frame."""
    _write(tmp_path)
    _run(tmp_path, "none", "gears")
    files = {p.name for p in (tmp_path / "c").rglob("gear*.graph.json")}
    assert files == {"gear0.graph.json", "gear1.graph.json"}
    _, result = _run(tmp_path, "none", "gears")
    assert result["equal"] == [True, True] and result["dynamo_frames"] == 0, result
    assert "loaded " in result["log"] and not _warnings(result["log"]), result["log"]


# In the cold process, calls after the first run from the entry as a warm process's do (guards,
# then the launch unit the first call built); a change must still never go unnoticed where the
# guard mode says it is checked. The changes that alter the cache key (config, sources, the
# parameters' dtype) are decided when the process starts: within one process they are guard
# failures like any other. Other gears on a new tensor are not a Dynamo guard: Dynamo serves its
# traced graph, whose gear unit refuses the size with the gears' ValueError, as torch.compile
# does (tests/inference/test_gears.py).
SAME_PROCESS = {change: ("fallback" if expected == "rebuild" else expected)
                for change, (_, expected) in CHANGES.items()
                if change not in ("config", "source_helper", "source_model", "gears_other")}
SAME_PROCESS["gears_none"] = "either"  # falls back to Dynamo, which serves its traced graph
# With TORCHAIR_CACHE_GUARDS=arguments (the default) a call checks the guards on its arguments
# and the process state; guards on module attributes and globals only on the first call and after
# a parameter / buffer / submodule assignment (m.double() re-assigns nothing: its parameters keep
# their objects, and the per-call input check sees their new dtype). These changes to module
# attributes and globals after the first call are served from the entry, as TorchAir serves
# every call after the first without guards; TORCHAIR_CACHE_GUARDS=all catches them.
MODULE_STATE = ("int_attr", "list_length", "global_int", "training", "swap_function",
                "instance_forward")


def _check_same_process(change, result, guards):
    log = result["log"]
    expected = SAME_PROCESS[change]
    if guards == "arguments" and change in MODULE_STATE:
        expected = "unchecked"
    else:
        assert result["equal"] and all(result["equal"]), f"{change}: result differs from eager"
    first = 1  # the cold call's Dynamo frame
    fell_back = [w for w in _warnings(log) if "does not fit the cached graph" in w]
    assert log.count("saved ") == 1, f"{change}: {log}"
    if expected in ("serve", "unchecked"):
        assert not _warnings(log), f"{change}: {_warnings(log)}"
        assert result["dynamo_frames"] == first, f"{change}: Dynamo traced again: {result}"
    elif expected == "fallback":
        assert fell_back, f"{change}: served without a fallback warning:\n{log}"
        # whether Dynamo then traces again is Dynamo's choice: torch 2.11's serves an aliased
        # call from its own entry (the result is checked equal to eager above)
        if not (change == "aliasing" and torch.torch_version.TorchVersion(torch.__version__)
                < (2, 13)):
            assert result["dynamo_frames"] > first, f"{change}: {result}"
    else:
        assert result["dynamo_frames"] == first or fell_back, f"{change}: silent retrace\n{log}"


def test_cold_process_serves_later_calls_from_the_entry_and_never_stale(tmp_path):
    _write(tmp_path)
    runs = [(c, "arguments") for c in SAME_PROCESS] + [(c, "all") for c in MODULE_STATE]
    with concurrent.futures.ThreadPoolExecutor(max_workers=3) as pool:
        results = list(pool.map(lambda r: _run(tmp_path, r[0], same_process=True,
                                               guards=r[1])[1], runs))
    failed = []
    for (change, guards), result in zip(runs, results):
        try:
            _check_same_process(change, result, guards)
        except AssertionError as error:
            failed.append(f"[{guards}] {error}")
    assert not failed, "\n\n".join(failed)
