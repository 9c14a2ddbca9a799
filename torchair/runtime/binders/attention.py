"""AttentionBinder: a CPU static unit's attention calls bound to the C++ launch kernels.

In a CPU static unit's FX graph (fixed shapes; see :mod:`torchair.runtime.units`), each
``npu_incre_flash_attention_tensor`` call that the launch kernel serves (decode: one query
token, no mask, pse_shift, antiquant or output quantization; the general op's shape validation
passes for the unit's fixed shapes; the kernel takes the shapes and strides) becomes a call of
``torchair_native::ifa_decode`` (:mod:`torchair.ops.attention.cpu.launch_library`), with
``defer_errors=True``: a bad length or block id is kept and the call returns zeros, and the unit
(wrapped by :func:`torchair.ops.attention.cpu.launch_errors.checked`) raises it after the run as
the ``ValueError`` eager raises::

    # before
    lens = aten.slice.Tensor(sunk_scalars, 0, 0, 4)
    attn = npu.npu_incre_flash_attention_tensor.default(q, k_cache, v_cache,
               actual_seq_lengths=lens, block_table=table, num_heads=8, input_layout='BNSD',
               num_key_value_heads=2, block_size=16, scale_value=0.125)
    # after
    lens = aten.slice.Tensor(sunk_scalars, 0, 0, 4)
    attn = torchair_native.ifa_decode.default(q, k_cache, v_cache, lens, None, table, 8, 2,
               1, 16, 0.125, True, True, <abi>)

``npu_fused_infer_attention_score_tensor`` decode calls that are IFA calls in disguise (one query
token, every argument IFA does not have at its default, the lse output unused, FIA's own
validation passing) are bound the same way in units that do not also call IFA, so that a
deferred error can be worded as FIA does (:func:`fia_errors`). Every other FIA call the kernel
computes exactly as FIA's dense formula (prompt calls with any number of query tokens, sparse
modes 0-4, with an atten_mask in modes 0/1 when it is the same for every head, query lengths; no
pse_shift, antiquant, output quantization, padding or lse output) is bound to
``torchair_native::fia_prompt``: each query token a row of the decode kernel with its own window
of KV positions (and its row of the mask), FIA's value checks and error texts in C++
(:func:`_fia_prompt_args`); so are such ``npu_fused_infer_attention_score_v2`` calls with the
output in the query's layout, their errors in v2's names (:func:`_fia_v2_as_v1`). FIA returns
``(out, lse)``: the bound call is its ``out``, and the unused ``getitem`` nodes go::

    # before
    fia = npu.npu_fused_infer_attention_score_tensor.default(q, k, v, num_heads=8, scale=0.125,
              input_layout='BSH', sparse_mode=3, actual_seq_lengths_kv=kv_lens)
    out = operator.getitem(fia, 0)
    # after
    out = torchair_native.fia_prompt.default(q, k, v, None, kv_lens, None, 8, 0, 0, 0, 0.125,
              3, <pre_tokens>, <next_tokens>, 2, 0, True, None, <abi>)

Lengths that were host lists in the traced call (slices of the unit's sunk scalar buffer,
:func:`torchair.base.sink_meta.sunk_slots`) are checked as eager checks host lists
(``host_lengths``): against a paged cache's block table and block count, and query lengths
against ``S_q``. The traced graph is never changed (the compile cache saves it with the general
ops): the binder returns a rewritten copy.
"""
from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx as fx

from torchair.base.sink_meta import sunk_slots
from torchair.ops.attention import (
    fia_checks as _fia_checks,
    fused_infer_attention_score as _fia,
    fused_infer_attention_score_v2 as _v2,
    ifa_checks as _ifa_checks,
    ifa_compute as _compute,
)
from torchair.ops.attention.cpu import launch_library as _library, native as _decode_native
from torchair.ops.attention.cpu.launch_fakes import abi, fia_prompt, ifa_decode

__all__ = ["AttentionBinder", "fia_errors"]


class AttentionBinder:
    """Binds the attention calls of a CPU static unit's graph to the launch kernels (module
    doc). ``binder(gm)`` returns ``(graph, count)``: a rewritten copy of ``gm`` and how many
    calls it binds, or ``(gm, 0)``, ``gm`` itself, when there are none or the kernels are not
    available. ``gm`` is never changed."""

    name = "bind_attention"

    def __call__(self, gm: fx.GraphModule) -> tuple[fx.GraphModule, int]:
        twin = torch.ops.npu.npu_incre_flash_attention_tensor.default
        taken = [(n, n.kwargs) for n in gm.graph.nodes
                 if n.op == "call_function" and n.target is twin and _takes(n)]
        fia, prompt = [], []
        fia_twin = torch.ops.npu.npu_fused_infer_attention_score_tensor.default
        as_ifa = fia_errors(gm)  # FIA calls only: a deferred error can be named after FIA
        for n in gm.graph.find_nodes(op="call_function", target=fia_twin):
            kwargs = _fia_as_ifa(n) if as_ifa else None
            if kwargs is not None and _decode_takes(n.args, kwargs):
                fia.append((n, kwargs))
                continue
            args = _fia_prompt_args(n)  # worded as FIA itself: units with IFA calls take them
            if args is not None:
                prompt.append((n, args))
        v2_twin = torch.ops.npu.npu_fused_infer_attention_score_v2_tensor.default
        for n in gm.graph.find_nodes(op="call_function", target=v2_twin):
            kwargs = _fia_v2_as_v1(n)
            args = _fia_prompt_args(n, kwargs, wording=1) if kwargs is not None else None
            if args is not None:
                prompt.append((n, args))
        if not (taken or fia or prompt) or not _library.available():
            return gm, 0
        graph = fx.Graph()
        copies: dict[fx.Node, fx.Node] = {}
        graph.output(graph.graph_copy(gm.graph, copies))
        calls = [(old, ifa_decode(), (_copied(kw.get("actual_seq_lengths"), copies), None,
                                      _copied(kw.get("block_table"), copies),
                                      kw.get("num_heads", 1), kw.get("num_key_value_heads", 0),
                                      _library.LAYOUTS[kw.get("input_layout", "BSH")],
                                      kw.get("block_size", 0), float(kw.get("scale_value", 1.0)),
                                      True,  # defer_errors: see launch_errors.checked
                                      _host_list(kw.get("actual_seq_lengths")),
                                      abi(ifa_decode())))
                 for old, kw in taken + fia]
        calls += [(old, fia_prompt(), (*(_copied(a, copies) for a in args), abi(fia_prompt())))
                  for old, args in prompt]
        for old, op, rest in calls:
            node = copies[old]
            with graph.inserting_before(node):
                new = graph.call_function(op, (*node.args, *rest))
            if old.target is twin:
                new.meta = dict(node.meta)
                node.replace_all_uses_with(new)
            else:  # FIA returns (out, lse): its out is the kernel's; the unused lse goes
                new.meta = {k: v for k, v in node.meta.items() if k != "val"}
                val = node.meta.get("val")
                if isinstance(val, (tuple, list)):
                    new.meta["val"] = val[0]
                for user in list(node.users):
                    if user.args[1] == 0:
                        user.replace_all_uses_with(new)
                    graph.erase_node(user)
            graph.erase_node(node)
        return fx.GraphModule(gm, graph), len(calls)


def fia_errors(gm: fx.GraphModule) -> bool:
    """Whether a unit's deferred launch-kernel errors come from ``npu_fused_infer_attention_score``
    calls: it calls FIA's tensor twin and not IFA's (only then are FIA calls bound as IFA ones)."""
    targets = {n.target for n in gm.graph.nodes if n.op == "call_function"}
    return (torch.ops.npu.npu_fused_infer_attention_score_tensor.default in targets
            and torch.ops.npu.npu_incre_flash_attention_tensor.default not in targets)


# keyword arguments of npu_incre_flash_attention_tensor that the launch kernel takes
_TAKEN = {"actual_seq_lengths", "block_table", "num_heads", "scale_value", "input_layout",
          "num_key_value_heads", "block_size", "inner_precise"}
# FIA keyword arguments -> IFA's, for a decode call the launch kernel serves; every other FIA
# argument must have its default (no masks, quantization, prefixes, rope or lse output)
_FIA_AS_IFA = {"actual_seq_lengths_kv": "actual_seq_lengths", "block_table": "block_table",
               "num_heads": "num_heads", "scale": "scale_value", "input_layout": "input_layout",
               "num_key_value_heads": "num_key_value_heads", "block_size": "block_size",
               "inner_precise": "inner_precise"}
# FIA keyword arguments torchair_native::fia_prompt takes; every other one must have its default
_FIA_PROMPT = {"actual_seq_lengths", "actual_seq_lengths_kv", "block_table", "num_heads", "scale",
               "input_layout", "num_key_value_heads", "block_size", "inner_precise",
               "sparse_mode", "pre_tokens", "next_tokens", "atten_mask"}


def _meta(val: Any) -> Any:
    """A meta tensor like the traced value ``val`` (shapes only: the general op's value checks
    skip meta tensors)."""
    if not isinstance(val, torch.Tensor):
        return val
    return torch.empty_strided(tuple(val.shape), tuple(val.stride()), dtype=val.dtype,
                               device="meta")


def _takes(node: fx.Node) -> bool:
    """The call's arguments, as traced, pass the general op's validation and are a decode call
    on CPU that the launch kernel serves."""
    if len(node.args) != 3 or any(k not in _TAKEN and v is not None
                                  for k, v in node.kwargs.items()):
        return False
    return _decode_takes(node.args, node.kwargs)


def _decode_takes(args: tuple, node_kwargs: dict) -> bool:
    """:func:`_takes` of IFA arguments (query, key, value and the keyword arguments, as FX
    nodes or constants; an FIA call's IFA equivalent too)."""
    if any(isinstance(a, fx.Node) and not isinstance(a.meta.get("val"), torch.Tensor)
           for a in [*args, node_kwargs.get("block_table")]):
        return False  # no traced tensor to check
    vals = [a.meta["val"] if isinstance(a, fx.Node) else a for a in args]
    kwargs = {k: (v.meta.get("val") if isinstance(v, fx.Node) else v)
              for k, v in node_kwargs.items()}
    lengths = node_kwargs.get("actual_seq_lengths")
    if isinstance(lengths, fx.Node) and not isinstance(lengths.meta.get("val"), torch.Tensor):
        # a slice of the sunk scalar buffer (no traced value): int64, as many entries as the
        # traced list had (a count the op refuses stays the general op's, which raises)
        kwargs["actual_seq_lengths"] = _sunk_lengths(lengths)
        if kwargs["actual_seq_lengths"] is None:
            return False
    for t in [*vals, kwargs.get("actual_seq_lengths"), kwargs.get("block_table")]:
        if t is not None and (not isinstance(t, torch.Tensor)
                              or t.device.type not in ("cpu", "meta")):
            return False
    query = vals[0]
    if query.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return False
    try:
        plan = _ifa_checks.validate(*(_meta(v) for v in vals),
                                    **{k: _meta(v) for k, v in kwargs.items()
                                       if k != "inner_precise"})
    except (ValueError, TypeError, RuntimeError):
        return False  # the general op raises its error at run time
    if plan.kv_int8 or not _compute.decode_eligible(plan, None):
        return False
    return _kernel_takes(plan, *vals, kwargs.get("block_table"))


def _defaults_but(kwargs: dict, taken: Any, defaults: dict) -> bool:
    """Every keyword argument not in ``taken`` has its default."""
    return all(name in taken or value == defaults.get(name, object())
               for name, value in kwargs.items())


def _only_output_used(node: fx.Node) -> bool:
    """The call's users only take its first output (FIA's softmax_lse is unused)."""
    return (all(u.op == "call_function" and u.target is operator.getitem for u in node.users)
            and not any(u.args[1] != 0 and u.users for u in node.users))


def _fia_as_ifa(node: fx.Node) -> dict | None:
    """IFA keyword arguments equivalent to an ``npu_fused_infer_attention_score_tensor`` call
    (one query token, the other arguments at their defaults, its lse output unused and its own
    validation passing), or None."""
    if (len(node.args) != 3 or not _defaults_but(node.kwargs, _FIA_AS_IFA, _fia.DEFAULTS)
            or not _only_output_used(node)):
        return None
    query = node.args[0].meta.get("val") if isinstance(node.args[0], fx.Node) else None
    if not isinstance(query, torch.Tensor):
        return None
    kwargs = {_FIA_AS_IFA[k]: v for k, v in node.kwargs.items() if k in _FIA_AS_IFA}
    try:
        metas = {k: _meta(v.meta.get("val") if isinstance(v, fx.Node) else v)
                 for k, v in node.kwargs.items()}
        lengths = node.kwargs.get("actual_seq_lengths_kv")
        if _host_list(lengths):
            metas["actual_seq_lengths_kv"] = _sunk_lengths(lengths)
            if metas["actual_seq_lengths_kv"] is None:
                return None
        plan = _fia_checks.validate(_fia.arguments(
            *(_meta(a.meta.get("val")) for a in node.args), metas))
    except (ValueError, TypeError, RuntimeError, NotImplementedError, AttributeError):
        return None
    if plan.ifa.dims.q_len != 1:
        return None
    return kwargs


def _fia_v2_as_v1(node: fx.Node) -> dict | None:
    """The v1 keyword arguments of an ``npu_fused_infer_attention_score_v2_tensor`` call whose
    output is in the query's layout (not NSD) and whose v2-only arguments have their defaults,
    or None."""
    kw = node.kwargs
    if not _defaults_but(kw, {*_v2.TO_V1, "input_layout"}, _v2.DEFAULTS):
        return None  # a v2-only argument in use (rope, int8 query, dtypes, ...)
    layout = kw.get("input_layout", "BSH")
    if not isinstance(layout, str) or layout not in _library.LAYOUTS:
        return None  # another output layout, NSD, TND/NTD
    return {_v2.TO_V1[k]: v for k, v in kw.items() if k in _v2.TO_V1} | {"input_layout": layout}


def _fia_prompt_args(node: fx.Node, kw: dict | None = None, wording: int = 0) -> tuple | None:
    """The ``torchair_native::fia_prompt`` arguments after (query, key, value) for an
    ``npu_fused_infer_attention_score_tensor`` call (or a v2 call: ``kw`` its v1 keyword
    arguments, ``wording`` 1) it computes exactly as the general op (launch_ops.cpp): no
    pse_shift, antiquant, output quantization, padding or prefixes; an atten_mask of sparse
    modes 0/1 the same for every head (a CPU tensor; modes 2-4 ignore theirs); the lse output
    unused; int64 CPU lengths; FIA's own validation passing for the unit's shapes; shapes the
    kernel takes. None otherwise (the call stays the general op's)."""
    kw = node.kwargs if kw is None else kw
    if (len(node.args) != 3 or not _defaults_but(kw, _FIA_PROMPT, _fia.DEFAULTS)
            or not _only_output_used(node)):
        return None
    for name in ("num_heads", "num_key_value_heads", "block_size", "sparse_mode", "pre_tokens",
                 "next_tokens", "input_layout", "scale"):
        if isinstance(kw.get(name), fx.Node):
            return None  # a symbolic option: not a fixed call
    mode = kw.get("sparse_mode", 0)
    if mode not in (0, 1, 2, 3, 4):
        return None
    mask = kw.get("atten_mask") if mode <= 1 else None
    if mask is not None:
        val = mask.meta.get("val") if isinstance(mask, fx.Node) else None
        if not (isinstance(val, torch.Tensor) and val.device.type == "cpu"
                and (val.dim() != 4 or val.shape[1] == 1)):
            return None  # a per-head mask (or no traced tensor): the general op's
    vals = [a.meta.get("val") if isinstance(a, fx.Node) else None for a in node.args]
    if not all(isinstance(v, torch.Tensor) and v.device.type == "cpu" for v in vals):
        return None
    query = vals[0]
    metas, host = {}, 0
    for name, value in kw.items():
        val = value.meta.get("val") if isinstance(value, fx.Node) else value
        if name in ("actual_seq_lengths", "actual_seq_lengths_kv") and value is not None:
            if not isinstance(value, fx.Node):
                return None  # host lists: the twin always has tensors
            if _host_list(value):  # a slice of the sunk scalar buffer; the general op checks
                # host lists further
                val = _sunk_lengths(value)
                if val is None:
                    return None
                host |= 1 if name == "actual_seq_lengths" else 2
            elif not (isinstance(val, torch.Tensor) and val.dtype == torch.int64
                      and val.dim() == 1 and val.device.type == "cpu"):
                return None
        elif isinstance(value, fx.Node) and not isinstance(val, torch.Tensor):
            return None
        if name == "block_table" and val is not None and val.device.type != "cpu":
            return None
        metas[name] = _meta(val)
    try:
        plan = _fia_checks.validate(_fia.arguments(*(_meta(v) for v in vals), metas))
    except (ValueError, TypeError, RuntimeError, NotImplementedError, AttributeError):
        return None  # the general op raises its error at run time
    if (plan.k_quant is not None or plan.v_quant is not None or plan.ifa.kv_padding is not None
            or query.dtype not in (torch.float32, torch.bfloat16, torch.float16)
            or plan.ifa.dims.q_len == 0 or plan.ifa.dims.kv_len == 0):
        return None  # (empty sequences: the general op's own behaviour, errors included)
    if not all(-2**63 <= int(kw.get(n, 0)) < 2**63 for n in ("pre_tokens", "next_tokens")):
        return None  # not an int64 of the kernel's schema
    table = kw.get("block_table")
    table_val = table.meta.get("val") if isinstance(table, fx.Node) else None
    if table is not None and not isinstance(table_val, torch.Tensor):
        return None
    if not _kernel_takes(plan.ifa, *vals, table_val):
        return None
    dims = plan.ifa.dims
    return (kw.get("actual_seq_lengths"), kw.get("actual_seq_lengths_kv"), table,
            dims.num_heads, dims.num_kv_heads, _library.LAYOUTS[plan.ifa.layout],
            kw.get("block_size", 0), float(kw.get("scale", 1.0)), int(mode),
            plan.pre_tokens, plan.next_tokens, host, wording, True, mask)


def _kernel_takes(plan: Any, query, key, value, table) -> bool:
    """The shapes launch_ops.cpp's ``canonical`` takes (so the C++ code never falls back to the
    general op inside a static unit, where the general op's errors would not be deferred)."""
    dims = plan.dims
    group = dims.num_heads // dims.num_kv_heads
    if (key.dtype != query.dtype or value.dtype != query.dtype
            or tuple(key.shape) != tuple(value.shape) or key.stride() != value.stride()
            or key.stride(-1) != 1 or dims.head_dim % 16 or dims.head_dim > _decode_native.MAX_D
            or group > _decode_native.MAX_G):
        return False
    if table is not None and (table.stride(1) != 1 or key.dim() == 4 and plan.layout != "BNSD"):
        return False
    return True


def _host_list(lengths: Any) -> bool:
    """Whether a length argument of a unit's call was a host list in the traced call: a slice of
    the unit's sunk scalar buffer (no traced value). The general op checks such lengths against
    a paged cache's block table (launch_ops.cpp: check_paged_lengths), so the kernel does too."""
    return isinstance(lengths, fx.Node) and not isinstance(lengths.meta.get("val"), torch.Tensor)


def _sunk_lengths(node: fx.Node) -> torch.Tensor | None:
    """A meta int64 tensor with as many entries as the host list a sunk length argument holds
    (the traced list's length is fixed for the unit), or None when the node is not a slice of
    the unit's sunk scalar buffer (:func:`torchair.base.sink_meta.sunk_slots`)."""
    slots = sunk_slots(node)
    if slots is None:
        return None
    return torch.empty(slots[1] - slots[0], dtype=torch.int64, device="meta")


def _copied(value: Any, copies: dict) -> Any:
    return copies.get(value, value) if isinstance(value, fx.Node) else value
