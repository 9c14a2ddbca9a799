"""Module state hoisted out of the per-call check (``guards.hoist``): the generated check serves the
module state it read last time while CPython's dict and type version tags say nothing it was read
through changed, and reads it again otherwise. Every change to module state a served call can see
(an attribute, a dict entry, a parameter swapped in its dict, a class attribute, ``__class__``,
a parameter's data) must reach the result, which is compared with eager each time."""
from __future__ import annotations

import pytest
import torch

import torchair
from torchair.inference import cache_compile
from torchair.inference.guards import hoist as guard_hoist
from torchair.runtime import unit_call

pytestmark = pytest.mark.skipif(unit_call.state_watch() is None,
                                reason="no C compiler, or this Python keeps no dict version tags")


class Norm(torch.nn.Module):
    def __init__(self, eps: float = 1e-6):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.linspace(0.5, 1.5, 8))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.norm = Norm()
        self.blocks = torch.nn.ModuleList([Norm(1e-5), Norm(1e-4)])
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        for block in self.blocks:
            x = block(x) + x
        return self.lin(self.norm(x))


def _config():
    config = torchair.CompilerConfig()
    config.debug.run_eagerly = True
    return config


def _served(tmp_path, model):
    """The model's forward through cache_compile after its cold call and three served calls (the
    per-call check has run, and read the module state once)."""
    cached = cache_compile(model.forward, config=_config(), cache_dir=str(tmp_path))
    with torch.no_grad():
        for _ in range(4):
            cached(torch.randn(4, 8))
    return cached


def _hoist(cached):
    program = cached.runtime.guards.program
    assert program is not None, "the per-call check was not generated"
    return program.hoist


def _equal_to_eager(cached, model, x):
    with torch.no_grad():
        got, want = cached(x), model(x)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_a_steady_loop_serves_the_state_read_once(tmp_path):
    model = Net().eval()
    cached = _served(tmp_path, model)
    hoist = _hoist(cached)
    assert hoist is not None and hoist.enabled and hoist.current is not None
    before = hoist.records
    for _ in range(5):
        _equal_to_eager(cached, model, torch.randn(4, 8))
    assert hoist.records == before, "a call with unchanged state read it again"
    assert hoist.current is not None


def _set_eps_property(model):
    type(model.norm).eps = property(lambda self: 0.5)  # a data descriptor beats the instance dict


class _OtherNorm(Norm):
    @property
    def eps(self):
        return 0.25


_SPARE = Norm(3.0)

# each change to module state a served call reads, made after the state was hoisted
CHANGES = {
    "attribute": lambda m: setattr(m.norm, "eps", 0.5),
    "attribute of a list's module": lambda m: setattr(m.blocks[1], "eps", 2.0),
    "__dict__ entry": lambda m: m.norm.__dict__.__setitem__("eps", 0.125),
    "object.__setattr__": lambda m: object.__setattr__(m.norm, "eps", 0.75),
    "parameter swapped in _parameters": lambda m: m.lin._parameters.__setitem__(
        "weight", torch.nn.Parameter(torch.randn(8, 8))),
    # built before the calls: building one registers its parameter, which bumps the module epoch.
    # Its eps is read through _modules and must reach the result; its weight (equal to the old
    # one's) is read from the parameter dicts of the last full check, the documented limit of
    # TORCHAIR_CACHE_GUARDS=arguments for submodules placed without a registration
    "submodule swapped in _modules": lambda m: m._modules.__setitem__("norm", _SPARE),
    "parameter data": lambda m: setattr(m.lin.weight, "data", torch.randn(8, 8)),
    "parameter written in place": lambda m: m.norm.weight.data.mul_(3.0),
    "__class__": lambda m: setattr(m.norm, "__class__", _OtherNorm),
    # the old __dict__'s tag never changes: the watch compares the object's dict itself
    "__dict__ replaced": lambda m: setattr(m.norm, "__dict__", dict(m.norm.__dict__, eps=0.5)),
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_every_change_to_hoisted_state_reaches_the_result(tmp_path, change):
    model = Net().eval()
    cached = _served(tmp_path, model)
    assert _hoist(cached).current is not None
    x = torch.randn(4, 8)
    with torch.no_grad():
        before = cached(x)
    CHANGES[change](model)
    with torch.no_grad():
        after, want = cached(x), model(x)
    assert not torch.equal(before, want), f"{change}: the change does not move the result"
    torch.testing.assert_close(after, want, rtol=0, atol=0)
    _equal_to_eager(cached, model, torch.randn(4, 8))  # and the call after it


def test_a_change_between_the_read_and_the_watch_is_not_kept(tmp_path):
    """Another thread assigning between the check's read of the state and the watch it then
    takes: the watch's tags already include the change, so the values read before it must not
    be kept (they would be served until some unrelated change)."""
    model = Net().eval()
    cached = _served(tmp_path, model)
    hoist = _hoist(cached)
    take = hoist._watch

    def late(*anchors):  # the other thread's assignment lands just before the tags are taken
        model.norm.eps = 0.5
        return take(*anchors)

    model.norm.eps = 0.25  # makes the next call read the state again (and take a watch)
    hoist._watch = late
    with torch.no_grad():
        cached(torch.randn(4, 8))  # read eps 0.25; then the assignment; then the watch
    hoist._watch = take
    for _ in range(3):
        _equal_to_eager(cached, model, torch.randn(4, 8))  # eps 0.5 from here on


def test_a_module_that_owns_its_cached_call_is_freed(tmp_path):
    """The watch holds no references the garbage collector cannot see: a module keeping its
    cache_compile'd method (module -> cached call -> check -> hoist -> watched module) is
    collected once dropped."""
    import gc
    import weakref

    class Owner(Net):
        def __init__(self):
            super().__init__()
            self.cached = cache_compile(self.forward, config=_config(), cache_dir=str(tmp_path))

    with torch.no_grad():
        Owner().eval().cached(torch.randn(4, 8))  # the cold process's call: saves the entry
        torch._dynamo.reset()  # (Dynamo keeps what it compiled; a warm process has no Dynamo)
        model = Owner().eval()
        for _ in range(4):
            model.cached(torch.randn(4, 8))
    assert model.cached.compiled is None, "not served from the entry"
    assert _hoist(model.cached).current is not None
    gone = weakref.ref(model)
    del model
    gc.collect()
    assert gone() is None, "the served module was kept alive"


def test_a_class_property_added_later_reaches_the_result(tmp_path):
    class Local(Norm):
        pass

    model = Net().eval()
    model.norm.__class__ = Local
    cached = _served(tmp_path, model)
    x = torch.randn(4, 8)
    with torch.no_grad():
        before = cached(x)
    Local.eps = property(lambda self: 0.5)  # the type's version tag changes, not the dict's
    with torch.no_grad():
        after, want = cached(x), model(x)
    assert not torch.equal(before, want)
    torch.testing.assert_close(after, want, rtol=0, atol=0)


class _Setting:
    """A class attribute's type, changed after it is defined (its version tag is then reset)."""


def test_a_shadowed_class_attribute_of_a_changed_type_keeps_the_hoist(tmp_path):
    class Shadowed(Net):
        scale = _Setting()  # shadowed by the instance's own float

        def __init__(self):
            super().__init__()
            self.scale = 2.0

        def forward(self, x):
            return super().forward(x) * self.scale

    _Setting.changed = True
    model = Shadowed().eval()
    cached = _served(tmp_path, model)
    hoist = _hoist(cached)
    assert hoist.enabled and hoist.current is not None
    model.scale = 3.0
    _equal_to_eager(cached, model, torch.randn(4, 8))


def test_state_that_changes_every_call_stops_the_hoist(tmp_path):
    model = Net().eval()
    cached = _served(tmp_path, model)
    hoist = _hoist(cached)
    for i in range(12):
        model.norm.eps = 1e-6 * (i + 2)  # read by the graph: every call sees a new value
        _equal_to_eager(cached, model, torch.randn(4, 8))
    assert not hoist.enabled and hoist.current is None
    records = hoist.records
    model.norm.eps = 0.5
    _equal_to_eager(cached, model, torch.randn(4, 8))
    assert hoist.records == records  # off for good: read per call, as without it


def test_a_list_on_the_path_keeps_the_state_read_per_call(tmp_path):
    class Scaled(Net):
        def __init__(self):
            super().__init__()
            self.scales = [1.0, 2.0]

        def forward(self, x):
            return super().forward(x) * self.scales[1]

    model = Scaled().eval()
    cached = _served(tmp_path, model)
    hoist = _hoist(cached)
    assert hoist is not None and hoist.current is None and not hoist.enabled
    model.scales[1] = 3.0  # a list item changes no dict: it must be read per call
    _equal_to_eager(cached, model, torch.randn(4, 8))


def test_switch_off_generates_no_hoist(tmp_path, monkeypatch):
    monkeypatch.setenv(guard_hoist.ENV_HOIST, "0")
    model = Net().eval()
    cached = _served(tmp_path, model)
    assert _hoist(cached) is None
    model.norm.eps = 0.5
    _equal_to_eager(cached, model, torch.randn(4, 8))


def test_watched_reads_what_a_tuple_list_or_descriptor_allows():
    helper = unit_call.state_watch()
    obj = Norm()
    steps = [(guard_hoist.ATTR, -1, "eps")]
    hoist = guard_hoist.StateHoist(steps, helper)
    assert hoist._watched(obj, (obj.eps,), ()) is not None
    assert hoist._still_held(obj, (obj.eps,), ())
    assert not hoist._still_held(obj, (0.5,), ())  # not the value the dict holds
    item = guard_hoist.StateHoist([(guard_hoist.ITEM, -1, 1)], helper)
    assert item._watched((1.0, 2.0), (2.0,), ()) == ((), (), (), ())  # a tuple never changes
    assert item._watched([1.0, 2.0], (2.0,), ()) is None  # a list may
    assert item._watched({1: 2.0}, (2.0,), ()) is not None
    assert hoist._watched(obj, (obj.eps,), ([],)) is None  # a parameter "dict" that is not one
    params = guard_hoist.StateHoist([], helper, ["weight"])
    assert params._still_held(None, (obj.weight,), (obj._parameters,))
    assert not params._still_held(None, (torch.zeros(1),), (obj._parameters,))


def test_the_watch_sees_each_kind_of_change():
    helper = unit_call.state_watch()
    d, obj = {"a": 1}, Norm()
    kept = []  # a watch holds no references: its caller keeps what it points at

    def watch():
        anchors = ((d, obj.__dict__), (obj,), ((obj, obj.__dict__),))
        kept.append(anchors)
        return helper.watch(*anchors)

    w = watch()
    assert helper.unchanged(w)
    d["a"] = 1  # the same value stored again: nothing changed
    assert helper.unchanged(w)
    d["b"] = 2
    assert not helper.unchanged(w)
    w = watch()
    del d["b"]
    assert not helper.unchanged(w)
    w = watch()
    obj.eps = 0.5
    assert not helper.unchanged(w)
    w = watch()
    obj.__dict__ = dict(obj.__dict__)  # replaced: its old dict's tag never changes
    assert not helper.unchanged(w)
    assert helper.watch((), (), ((obj, {}),)) is None  # not the object's __dict__
    with pytest.raises(TypeError, match="dict"):
        helper.watch((torch.nn.ParameterDict(),), (), ())


def test_distinct_is_the_no_aliasing_guard():
    """``distinct(*objects)``: the generated check's form of Dynamo's ``check_no_aliasing``
    (objects, not storages: two views of one tensor are distinct), the same answer as the
    general check's ``len({id(...)}) == n``."""
    distinct = unit_call.state_watch().distinct
    a, b = torch.zeros(2), torch.zeros(2)
    view = a.view(2)
    for objects in [(), (a,), (a, b), (a, view), (a, b, a), (b, a, b, view), (a, a)]:
        assert distinct(*objects) == (len({id(o) for o in objects}) == len(objects))
    many = [torch.zeros(1) for _ in range(40)]
    assert distinct(*many)
    assert not distinct(*many, many[17])


@pytest.mark.parametrize("impl", ["c", "python"])
def test_replace_same_swaps_all_or_nothing(impl):
    """``replace_same`` (C, and the Python fallback of ``_cache_runtime``): the numbers a served
    call passes are swapped for their tensors only when every one is the very object recorded."""
    from torchair.inference._cache_runtime import _replace_same_py

    replace = unit_call.state_watch().replace_same if impl == "c" else _replace_same_py
    eps, scale = 1e-6, 0.5
    t_eps, t_scale = torch.tensor(eps), torch.tensor(scale)
    flat = ["x", eps, "y", scale]
    assert replace(flat, (1, 3), (eps, scale), (t_eps, t_scale))
    assert flat[1] is t_eps and flat[3] is t_scale and flat[0] == "x" and flat[2] == "y"
    equal_not_same = float("1e-6")  # an equal number, another object: not swapped
    flat = ["x", equal_not_same, "y", scale]
    assert not replace(flat, (1, 3), (eps, scale), (t_eps, t_scale))
    assert flat == ["x", equal_not_same, "y", scale]  # nothing changed, not even slot 1
    flat = ["x", eps, "y", 0.25]
    assert not replace(flat, (1, 3), (eps, scale), (t_eps, t_scale))
    assert flat[1] is eps
    assert replace([], (), (), ())
    if impl == "c":
        with pytest.raises(IndexError):
            replace(["x"], (3,), (eps,), (t_eps,))
        with pytest.raises(ValueError):
            replace(["x", eps], (1,), (eps, scale), (t_eps,))
