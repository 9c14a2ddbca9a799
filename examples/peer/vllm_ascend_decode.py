"""A decode loop in the shape of vllm-ascend's TorchAir model path (Qwen2, W8A8), written for Ascend.

Run it under the emulation: ``torchair run examples/peer/vllm_ascend_decode.py [--cache-dir D]``.
What it does as vllm-ascend's TorchAir runner did:

- rope through ``torch_npu.npu_apply_rotary_pos_emb`` (BSND), with ``cos`` / ``sin`` looked up
  by position inside the compiled step and kept on the rope module (``self.cos_embed``);
- KV-cache writes through ``torch_npu.npu_scatter_nd_update_`` at (block, offset) indices made
  from the slot mapping; paged attention through ``npu_fused_infer_attention_score`` (BSH, block
  table, ``actual_seq_lengths_kv`` as a host list);
- W8A8 linear layers: ``npu_dynamic_quant`` then ``npu_quant_matmul`` with per-channel weight
  scales and per-token activation scales; ``npu_swiglu`` between the MLP projections;
- the live batch padded up to the smallest graph batch size with torchair's
  ``torchair.inference.pad_batch`` (padded lengths 1, slots in a spare block);
- one ``cache_compile`` per graph batch size (``dynamic=True, fullgraph=True``, a fresh code object
  per batch size as vllm-ascend names it ``<Model>_forward_with_batch_size_<n>``), with
  ``tiling_schedule_optimize`` on and the inputs marked static: path 4, one launch unit.

It prints one JSON line: the compiled steps' outputs, whether they equal the same model run
eagerly, and how many Dynamo graphs this process compiled.
"""
import argparse
import json
import types

import torch
import torch.nn.functional as F
import torch_npu

import torchair

DEV = "npu:0"
GRAPH_BATCH_SIZES = [2, 4]  # vllm-ascend's torchair_graph_config.graph_batch_sizes
HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER, VOCAB, LAYERS = 64, 4, 2, 16, 96, 128, 2
BLOCKS, BLOCK_SIZE, MAX_BLOCKS, MAX_POS = 16, 16, 2, 64


class W8A8Linear(torch.nn.Module):
    """int8 weight, per-channel scale; the activation quantized per token at run time."""

    def __init__(self, n_in, n_out):
        super().__init__()
        w = torch.randn(n_out, n_in) / n_in ** 0.5
        scale = w.abs().amax(dim=1) / 127.0
        self.register_buffer("weight", torch.round(w / scale[:, None]).to(torch.int8).t()
                             .contiguous())
        self.register_buffer("weight_scale", scale.float())

    def forward(self, x):
        shape = x.shape
        x_q, x_scale = torch_npu.npu_dynamic_quant(x.reshape(-1, shape[-1]))
        y = torch_npu.npu_quant_matmul(x_q, self.weight, self.weight_scale,
                                       pertoken_scale=x_scale, output_dtype=x.dtype)
        return y.reshape(*shape[:-1], -1)


class Rope(torch.nn.Module):
    def __init__(self):
        super().__init__()
        inv_freq = 1.0 / (10000 ** (torch.arange(0, HEAD_DIM, 2).float() / HEAD_DIM))
        freqs = torch.outer(torch.arange(MAX_POS).float(), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos().half(), persistent=False)
        self.register_buffer("sin", emb.sin().half(), persistent=False)
        self.embed = F.embedding

    def forward(self, positions, q, k):
        cos = self.embed(positions, self.cos)
        sin = self.embed(positions, self.sin)
        self.cos_embed, self.sin_embed = cos, sin  # as vllm-ascend's rope keeps them
        q = q.view(*q.shape[:-1], -1, HEAD_DIM).unsqueeze(1)
        k = k.view(*k.shape[:-1], -1, HEAD_DIM).unsqueeze(1)
        cos, sin = cos.unsqueeze(-2).unsqueeze(-2), sin.unsqueeze(-2).unsqueeze(-2)
        q, k = torch_npu.npu_apply_rotary_pos_emb(q, k, cos, sin)
        return q.flatten(-2), k.flatten(-2)


class Layer(torch.nn.Module):
    def __init__(self, rope):
        super().__init__()
        self.rope = rope
        self.qkv = W8A8Linear(HIDDEN, (HEADS + 2 * KV_HEADS) * HEAD_DIM)
        self.o = W8A8Linear(HEADS * HEAD_DIM, HIDDEN)
        self.gate_up = W8A8Linear(HIDDEN, 2 * INTER)
        self.down = W8A8Linear(INTER, HIDDEN)
        self.norm1 = torch.nn.Parameter(1 + 0.1 * torch.randn(HIDDEN).half())
        self.norm2 = torch.nn.Parameter(1 + 0.1 * torch.randn(HIDDEN).half())
        self.scale_tensor = torch.zeros((), dtype=torch.int32)

    def forward(self, h, positions, kv_cache, meta):
        x = torch_npu.npu_rms_norm(h, self.norm1, 1e-6)[0]
        q, k, v = self.qkv(x).split([HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM,
                                     KV_HEADS * HEAD_DIM], dim=-1)
        q, k = self.rope(positions, q, k)
        key_cache, value_cache = kv_cache[0], kv_cache[1]
        block_size = self.scale_tensor + key_cache.shape[1]
        slots = meta["slot_mapping"].reshape(-1, 1)
        indices = torch.cat((slots // block_size, slots % block_size), dim=1)
        torch_npu.npu_scatter_nd_update_(key_cache, indices, k.reshape(-1, KV_HEADS * HEAD_DIM))
        torch_npu.npu_scatter_nd_update_(value_cache, indices, v.contiguous())
        attn, _ = torch_npu.npu_fused_infer_attention_score(
            q.reshape(-1, 1, HEADS * HEAD_DIM), key_cache, value_cache, num_heads=HEADS,
            num_key_value_heads=KV_HEADS, input_layout="BSH", scale=HEAD_DIM ** -0.5,
            block_table=meta["block_table"], block_size=BLOCK_SIZE,
            actual_seq_lengths_kv=meta["seq_lens_list"])
        x, _, h = torch_npu.npu_add_rms_norm(h, self.o(attn.reshape(-1, HEADS * HEAD_DIM)),
                                             self.norm2, 1e-6)
        return h + self.down(torch_npu.npu_swiglu(self.gate_up(x)))


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, HIDDEN)
        rope = Rope()
        self.layers = torch.nn.ModuleList(Layer(rope) for _ in range(LAYERS))
        self.norm = torch.nn.Parameter(torch.ones(HIDDEN).half())

    def forward(self, input_ids, positions, kv_caches, meta):
        h = self.embed(input_ids)
        for layer, kv in zip(self.layers, kv_caches):
            h = layer(h, positions, kv, meta)
        return torch_npu.npu_rms_norm(h, self.norm, 1e-6)[0]


def compiled_for(model, batch_size, cache_dir, compiled):
    """vllm-ascend's ``_get_torchair_lazy_compiled_model``: one cache_compile per batch size."""
    if batch_size in compiled:
        return compiled[batch_size]
    config = torchair.CompilerConfig()
    config.debug.run_eagerly = True  # the FX engine: quick to build on a small CPU
    config.experimental_config.frozen_parameter = True
    config.experimental_config.tiling_schedule_optimize = True
    # pattern fusion would turn npu_add_rms_norm -> npu_dynamic_quant into the fused op, which
    # quantizes the float32 norm instead of its float16 rounding (one int8 step apart in ~0.4% of
    # the values, see torchair.ops.quant.dynamic_quant): off, so "equal to eager" is bit for bit
    config.experimental_config.pattern_fusion_pass = False
    name = f"{type(model).__name__}_forward_with_batch_size_{batch_size}"
    code = model.forward.__code__.replace(co_name=name)
    fn = types.FunctionType(code, model.forward.__globals__, name=name,
                            argdefs=model.forward.__defaults__)
    model.__dict__[name] = fn.__get__(model, torch.nn.Module)
    compiled[batch_size] = torchair.inference.cache_compile(
        model.__dict__[name], dynamic=True, fullgraph=True, cache_dir=cache_dir, config=config,
        ge_cache=False)
    return compiled[batch_size]


def new_caches():
    return [torch.zeros(2, BLOCKS, BLOCK_SIZE, KV_HEADS * HEAD_DIM, dtype=torch.float16,
                        device=DEV) for _ in range(LAYERS)]


def step_inputs(batch, step):
    """Decode inputs for ``batch`` live requests padded to the next graph batch size (vllm-ascend
    pads the slots with -1... here with slots of a spare block, and lengths with 1)."""
    g = torch.Generator().manual_seed(100 * batch + step)
    padded = torchair.inference.pad_batch(batch, GRAPH_BATCH_SIZES,
                                          seq_lens=[3 + step + 2 * i for i in range(batch)])
    lens, graph_batch = padded.seq_lens, padded.size
    table = torch.zeros(graph_batch, MAX_BLOCKS, dtype=torch.int32)
    for b in range(graph_batch):
        table[b] = torch.arange(b * MAX_BLOCKS, (b + 1) * MAX_BLOCKS, dtype=torch.int32) \
            % BLOCKS
    slots = torch.tensor([int(table[b, (n - 1) // BLOCK_SIZE]) * BLOCK_SIZE + (n - 1) % BLOCK_SIZE
                          for b, n in enumerate(lens)], dtype=torch.int64)
    ids = torch.randint(0, VOCAB, (graph_batch,), generator=g)
    pos = torch.tensor([n - 1 for n in lens], dtype=torch.int64)
    meta = {"slot_mapping": slots.to(DEV), "block_table": table.to(DEV), "seq_lens_list": lens}
    return ids.to(DEV), pos.to(DEV), meta


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cache-dir", default=".torchair_cache/vllm_ascend_decode")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = Model().half().to(DEV).eval()
    for m in model.modules():  # quantization scales stay float32, as W8A8 checkpoints keep them
        if isinstance(m, W8A8Linear):
            m.weight_scale = m.weight_scale.float()
    eager_caches, graph_caches = new_caches(), new_caches()
    compiled, outs, equal = {}, [], True
    with torch.no_grad():
        for live in (3, 2):  # padded to 4, and 2 as it is
            graph_batch = torchair.inference.graph_batch_size(live, GRAPH_BATCH_SIZES)
            for step in range(3):
                ids, pos, meta = step_inputs(live, step)
                for t in (ids, pos, meta["slot_mapping"], meta["block_table"], *graph_caches):
                    torch._dynamo.mark_static(t)
                want = model(ids, pos, eager_caches, meta)
                got = compiled_for(model, graph_batch, args.cache_dir, compiled)(
                    ids, pos, graph_caches, meta)
                equal &= torch.equal(got, want)
                outs.append(got[:live].float().sum().item())
    equal &= all(torch.equal(a, b) for a, b in zip(eager_caches, graph_caches))
    # the compiled step keeps cos / sin on the rope module as the eager one does (replayed on a
    # warm start, where no Dynamo code runs): remove them, run one compiled step, compare
    rope = model.layers[0].rope
    del rope.cos_embed, rope.sin_embed
    with torch.no_grad():
        compiled_for(model, 2, args.cache_dir, compiled)(ids, pos, graph_caches, meta)
    kept = getattr(rope, "cos_embed", None)
    kept_ok = kept is not None and torch.equal(kept, rope.cos[pos])
    from torch._dynamo.utils import counters
    print(json.dumps({"outs": outs, "equal_to_eager": bool(equal),
                      "graphs": counters["stats"]["unique_graphs"],
                      "cos_embed_kept": bool(kept_ok), "device": DEV}))


if __name__ == "__main__":
    main()
