"""cache_compile caches what TorchAir caches, shaped like TorchAir's own cases
(``tests/st/torchair_cache_compile_st.py`` and ``tests/smoke/cache_compile_test.py``): dataclass
arguments (the ``InputMeta`` prompt/decode pattern) with guarded fields, dataclass outputs,
outputs that alias inputs (views, ``split``, ``view_as_real``), tensors reached through closures,
module globals and KV-cache lists held by modules, a ``dynamic=True`` entry served at new batch
sizes, calls with gradients enabled, ``backend=`` and the RNG refusal.

The cold start runs in one process, the warm starts in others; a warm process counts the graphs
Dynamo traced for every case (zero when served from the entry).
"""
import functools
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import torchair
from torchair.inference import cache_compile

MODELS = '''
import dataclasses
import json
import sys
import types
from typing import List

import torch
import torchair
from torchair.inference import cache_compile

GLOBAL_SHIFT = torch.linspace(0, 1, 4)


@dataclasses.dataclass
class InputMeta:
    data: torch.Tensor
    is_prompt: bool


@dataclasses.dataclass
class CustomData:
    hidden: torch.Tensor
    residual: torch.Tensor


def config():
    c = torchair.CompilerConfig()
    c.debug.run_eagerly = True
    return c


class Hint(torch.nn.Module):
    """TorchAir's test_cache_hint: one entry for prompt, one for decode, dataclass + list args."""

    def __init__(self, cache_dir):
        super().__init__()
        self.linear = torch.nn.Linear(2, 2)
        self.cached_prompt = cache_compile(self.prompt, config=config(), cache_dir=cache_dir)
        self.cached_decode = cache_compile(self.decode, config=config(), cache_dir=cache_dir)

    def forward(self, x: InputMeta, kv: List[torch.Tensor]):
        if x.is_prompt:
            return self.cached_prompt(x, kv)
        return self.cached_decode(x, kv)

    def _forward(self, x, kv):
        out = self.linear(x.data) + kv[0]
        return out * 2 if x.is_prompt else out

    def prompt(self, x, kv):
        return self._forward(x, kv)

    def decode(self, x, kv):
        return self._forward(x, kv)


class Outputs(torch.nn.Module):
    """Dataclass output; outputs aliasing inputs (view, split, view_as_real, a transposed view)
    and graph intermediates; a size and a SymInt expression returned as Python ints."""

    def __init__(self, cache_dir):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.cached = cache_compile(self.step, config=config(), cache_dir=cache_dir)

    def step(self, x, c):
        h = self.linear(x)
        add1 = h + 1
        return (CustomData(h, add1 - x), x.view(2, -1), x.split(2), torch.view_as_real(c),
                x.t(), add1.shape[0], 2 * x.shape[0], add1[0].view(2, -1))


class KVCache(torch.nn.Module):
    """TorchAir's smoke test: a KV cache as plain nested lists in the module, forward replaced
    by a closure bound with types.MethodType, a module global and a closure tensor."""

    def __init__(self, cache_dir):
        super().__init__()
        self.kv_cache = [[torch.zeros(4, 4), torch.zeros(4, 4)] for _ in range(2)]
        scale = torch.tensor(2.0)

        def forward(self, x, slot: torch.Tensor):
            for k_cache, v_cache in self.kv_cache:
                k_cache.index_copy_(0, slot, x)
                v_cache.index_copy_(0, slot, x * scale)
            return sum(k.sum(0) + v.sum(0) for k, v in self.kv_cache) + GLOBAL_SHIFT

        self.forward = types.MethodType(forward, self)
        self.cached = cache_compile(self.forward, config=config(), cache_dir=cache_dir)


def same(a, b):
    if dataclasses.is_dataclass(a):
        return type(a) is type(b) and all(same(getattr(a, f.name), getattr(b, f.name))
                                          for f in dataclasses.fields(a))
    if isinstance(a, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    if isinstance(a, torch.Tensor):
        return (isinstance(b, torch.Tensor) and a.shape == b.shape and a.stride() == b.stride()
                and torch.equal(a, b))
    return type(a) is type(b) and a == b


def shares(out, x):
    return out.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()


def graphs():
    dynamo = sys.modules.get("torch._dynamo")
    return dynamo.utils.counters["stats"]["unique_graphs"] if dynamo is not None else 0


def main(cache_dir, phase):
    torch.manual_seed(0)
    hint, outputs, kv = Hint(cache_dir), Outputs(cache_dir), KVCache(cache_dir)
    report = {}

    def case(name, run):
        before = graphs()
        report[name] = dict(run(), graphs=graphs() - before)

    batches = [3] if phase == "cold" else [2, 4, 3]
    fields = phase == "fields"
    for b in batches:
        def hint_case(b=b):
            x = torch.randn(b, 2)
            kvs = [torch.randn(b, 2)]
            ok = []
            for prompt in (True, False):
                meta = InputMeta(x, prompt if not fields else not prompt)
                call = hint.cached_prompt if prompt else hint.cached_decode
                with torch.no_grad():
                    ok.append(same(call(meta, kvs), (hint.prompt if prompt else hint.decode)(
                        meta, kvs)))
            return {"equal": all(ok)}
        case(f"hint_batch{b}", hint_case)
    if fields:
        print(json.dumps(report))
        return

    def outputs_case():
        x = torch.randn(4, 4)
        c = torch.randn(4, 2, dtype=torch.complex64)
        with torch.no_grad():
            got, want = outputs.cached(x, c), outputs.step(x, c)
        aliases = [shares(got[1], x), all(shares(p, x) for p in got[2]), shares(got[3], c),
                   shares(got[4], x), shares(got[7], got[0].hidden) is False,
                   shares(got[0].hidden, x) is False]
        x.add_(1)  # the views see the change, as eager's do
        seen = torch.equal(got[1], x.view(2, -1)) and torch.equal(got[4], x.t())
        return {"equal": same(got, want), "aliases": aliases + [seen],
                "types": [type(v).__name__ for v in got]}
    case("outputs", outputs_case)

    def kv_case():
        twin = KVCache(cache_dir)
        x, slot = torch.randn(2, 4), torch.tensor([1, 3])
        with torch.no_grad():
            got = kv.cached(x, slot)
            want = twin.forward(x, slot)
        caches = all(torch.equal(a, b) for la, lb in zip(kv.kv_cache, twin.kv_cache)
                     for a, b in zip(la, lb))
        return {"equal": same(got, want) and caches}
    case("kv_cache", kv_case)
    print(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
'''


def _run(tmp_path, phase):
    done = subprocess.run([sys.executable, str(tmp_path / "fid_models.py"), str(tmp_path / "c"),
                           phase], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env=dict(os.environ, TORCHAIR_LOG_LEVEL="INFO"))
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def test_torchair_shaped_cases_are_cached_and_served_without_dynamo(tmp_path):
    (tmp_path / "fid_models.py").write_text(textwrap.dedent(MODELS))
    cold, log = _run(tmp_path, "cold")
    assert all(r["equal"] for r in cold.values()), cold
    assert log.count("saved ") == 4, log  # prompt, decode, outputs, kv_cache: all cacheable
    assert "not cached" not in log, log

    warm, log = _run(tmp_path, "warm")
    assert "[torchair WARNING]" not in log, log
    for name, r in warm.items():
        assert r["equal"], (name, r)
        assert r["graphs"] == 0, (name, r)  # served from the entry: Dynamo never traced
    assert set(warm) == {"hint_batch2", "hint_batch4", "hint_batch3", "outputs", "kv_cache"}
    assert warm["outputs"]["aliases"] == [True] * 7, warm["outputs"]
    assert warm["outputs"]["types"] == ["CustomData", "Tensor", "tuple", "Tensor", "Tensor",
                                        "int", "int", "Tensor"]

    # a dataclass field the function branches on is guarded: another value falls back
    fields, log = _run(tmp_path, "fields")
    assert all(r["equal"] for r in fields.values()), fields
    assert "L['x'].is_prompt" in log and "does not fit the cached graph" in log, log


def _config():
    config = torchair.CompilerConfig()
    config.debug.run_eagerly = True
    return config


class Small(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def step(self, x):
        return self.linear(x).relu()

    def noisy(self, x):
        return self.linear(x) + torch.rand_like(x)


def test_call_with_grad_enabled_runs_under_no_grad_and_backward_fails(tmp_path, torchair_log):
    model = Small()
    cached = cache_compile(model.step, config=_config(), cache_dir=str(tmp_path))
    x = torch.randn(2, 4, requires_grad=True)
    assert torch.is_grad_enabled()
    out = cached(x)
    with torch.no_grad():
        assert torch.equal(out, model.step(x))
    assert not out.requires_grad and torch.is_grad_enabled()
    with pytest.raises(RuntimeError, match="does not require grad"):
        out.sum().backward()
    messages = [r.getMessage() for r in torchair_log]
    assert sum("torch.no_grad()" in m for m in messages) == 1
    cached(x)  # warned once
    assert sum("torch.no_grad()" in r.getMessage() for r in torchair_log) == 1


def test_backend_is_accepted_and_a_different_config_is_torchairs_value_error(tmp_path):
    model = Small()
    config = _config()
    backend = torchair.get_npu_backend(compiler_config=config)
    cached = cache_compile(model.step, backend=backend, cache_dir=str(tmp_path))
    x = torch.randn(2, 4)
    with torch.no_grad():
        assert torch.equal(cached(x), model.step(x))
    cache_compile(model.step, config=_config(), backend=backend, cache_dir=str(tmp_path))
    # a functools.partial carrying compiler_config, as TorchAir's get_npu_backend returns
    partial = functools.partial(lambda gm, inputs, compiler_config=None: gm,
                                compiler_config=config)
    cache_compile(model.step, backend=partial, cache_dir=str(tmp_path))
    other = _config()
    other.experimental_config.frozen_parameter = True
    with pytest.raises(ValueError, match="^config in current backend is different from the "
                                         "config during cache generation.$"):
        cache_compile(model.step, config=other, backend=backend, cache_dir=str(tmp_path))
    with pytest.raises(TypeError, match="get_npu_backend"):
        cache_compile(model.step, backend="inductor", cache_dir=str(tmp_path))


def test_random_ops_are_refused_with_torchairs_exception(tmp_path):
    model = Small()
    cached = cache_compile(model.noisy, config=_config(), cache_dir=str(tmp_path))
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed) as info:
        cached(torch.randn(2, 4))
    inner = info.value.inner_exception
    assert isinstance(inner, AssertionError)
    assert str(inner).startswith("Cache compile dose not support operator that depend on RNG, "
                                 "input index: ")
    assert "rand_like" in str(inner)
    assert not list(tmp_path.rglob("meta.json"))



class _Flags:
    compiling = False
    note = None


FLAGS = _Flags()


class Flagged(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def step(self, x):
        FLAGS.compiling = True  # transformers' output capturing does this around its forward
        y = self.linear(x)
        FLAGS.compiling = False
        FLAGS.note = "done"
        return y


def test_constant_attribute_writes_are_replayed_after_a_warm_call(tmp_path, torchair_log):
    model = Flagged()
    x = torch.randn(2, 4)
    with torch.no_grad():
        cache_compile(model.step, config=_config(), cache_dir=str(tmp_path))(x)
    assert list(tmp_path.rglob("meta.json")), [r.getMessage() for r in torchair_log]
    torch._dynamo.reset()
    FLAGS.compiling, FLAGS.note = True, None  # stale values a warm call must overwrite
    warm = cache_compile(model.step, config=_config(), cache_dir=str(tmp_path))
    with torch.no_grad():
        assert torch.equal(warm(x), model.step(x))
        FLAGS.compiling, FLAGS.note = True, None
        warm(x)
    assert warm.runtime is not None  # served from the entry
    assert FLAGS.compiling is False and FLAGS.note == "done"
