"""A model whose KV cache is a module buffer, written in place, matches eager on every path."""
import pytest
import torch
import torch._dynamo

import torchair
from torchair.runtime.units import capture_mode

B, S, H, HEADS = 2, 16, 32, 4

COMPILE = {  # path -> (torch.compile dynamic, mark_static on the inputs, tiling sink)
    1: (False, False, False),
    2: (True, False, False),
    3: (True, True, False),
    4: (True, True, True),
}


class BufferCache(torch.nn.Module):
    def __init__(self, write: str) -> None:
        super().__init__()
        self.write = write
        self.q = torch.nn.Linear(H, H)
        self.kv = torch.nn.Linear(H, 2 * H)
        self.register_buffer("k_cache", torch.zeros(B, S, H))
        self.register_buffer("v_cache", torch.zeros(B, S, H))

    def forward(self, x, pos, lens):
        k, v = self.kv(x).chunk(2, dim=-1)
        if self.write == "index_copy":
            self.k_cache.index_copy_(1, pos, k)
            self.v_cache.index_copy_(1, pos, v)
        else:  # slice assignment at a tensor position: index_put_
            self.k_cache[:, pos] = k
            self.v_cache[:, pos] = v
        return torch.ops.npu.npu_incre_flash_attention(
            self.q(x), self.k_cache, self.v_cache, actual_seq_lengths=lens, num_heads=HEADS,
            input_layout="BSH", scale_value=0.3)


@pytest.mark.parametrize("write", ["index_copy", "slice_assign"])
@pytest.mark.parametrize("path,capture", [(1, None), (2, None), (3, None), (4, None),
                                          (4, "emulate")])
def test_buffer_kv_cache_matches_eager(path, capture, write):
    with capture_mode(capture):
        _check_against_eager(path, write)


def _check_against_eager(path, write):
    dynamic, mark, tiling = COMPILE[path]
    torch.manual_seed(0)
    model, twin = BufferCache(write), BufferCache(write)
    twin.load_state_dict(model.state_dict())
    config = torchair.CompilerConfig()
    config.debug.run_eagerly = True
    config.experimental_config.tiling_schedule_optimize = tiling
    compiled = torch.compile(model, backend=torchair.get_npu_backend(compiler_config=config),
                             dynamic=dynamic, fullgraph=True)
    before = len(torchair.graph_reports())
    steps = [([5, 7], 3), ([2, 9], 4), ([1, 1], 0), ([16, 4], 15), ([8, 8], 7), ([3, 12], 11)]
    with torch.no_grad():
        for step, (lens, pos) in enumerate(steps):
            x, p = torch.randn(B, 1, H), torch.tensor([pos])
            if mark:
                torch._dynamo.mark_static(x)
                torch._dynamo.mark_static(p)
            torch.testing.assert_close(compiled(x, p, lens), twin(x, p, lens),
                                       msg=lambda m: f"step {step}: {m}")
            assert torch.equal(model.k_cache, twin.k_cache), f"step {step}: key cache"
            assert torch.equal(model.v_cache, twin.v_cache), f"step {step}: value cache"
    reports = torchair.graph_reports()[before:]
    assert len(reports) == (len(steps) if path == 1 else 1)
    assert all(r.inputs[i].mutated for r in reports for i in range(len(r.inputs))
               if r.inputs[i].name.endswith(("k_cache_", "v_cache_")))
    if path == 4:
        assert reports[0].build_static and reports[0].sunk_inputs
