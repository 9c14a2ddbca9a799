# A TorchAir script written for Ascend, the way the TorchAir docs and tests write them
# (torch_npu, "npu" devices, streams and events, a CompilerConfig, the npu backend).
# Off Ascend, run it unchanged with:   torchair run examples/peer/npu_script.py OUT.pt
# examples/peer/cpu_script.py is the same computation written for the CPU; both save their
# results to OUT.pt (torch.save), and tests/compat/test_peer_script.py checks they are equal.
import sys

import torch
import torch_npu

import torchair
from torchair.configs.compiler_config import CompilerConfig

torch.manual_seed(7)
torch.npu.manual_seed_all(7)
torch.npu.set_compile_mode(jit_compile=False)
torch.npu.config.allow_internal_format = False
torch.npu.set_device(0)


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(16, 8)

    def forward(self, x, scale):
        y = self.linear(x) * scale
        offset = torch.arange(8, device="npu:0") * 0.5
        ones = torch.ones(8, device=torch.device("npu", 0))
        y = torch.relu(y + offset) + ones.to("npu")
        res = y.to(torch.float16).npu().float()
        return res, torch_npu.npu_rms_norm(y, torch.full((8,), 2.0, device="npu"))[0]


config = CompilerConfig()
config.mode = "max-autotune"
config.experimental_config.frozen_parameter = True
config.debug.graph_dump.type = "py"
config.debug.run_eagerly = True
npu_backend = torchair.get_npu_backend(compiler_config=config)

device = torch.device("npu:0")
model = Model().to(device)
model.eval()
opt_model = torch.compile(model, backend=npu_backend, fullgraph=True)

x = torch.randn(4, 16).npu()
scale = torch.tensor([1.5], device="npu:0")

stream = torch.npu.Stream()
start = torch.npu.Event(enable_timing=True)
end = torch.npu.Event(enable_timing=True)
start.record()
with torch.no_grad(), torch.npu.stream(stream):
    out, normed = opt_model(x, scale)
    eager_out, eager_normed = model(x, scale)
end.record()
torch.npu.current_stream().wait_stream(stream)
out.record_stream(torch.npu.current_stream())
torch.npu.synchronize()
elapsed_ms = start.elapsed_time(end)

torch.npu.manual_seed(11)
noise = torch.randn(4, 8, device="npu")

results = {
    "out": out.cpu(),
    "normed": normed.cpu(),
    "matches_eager": bool(torch.equal(out, eager_out) and torch.equal(normed, eager_normed)),
    "noise": noise.cpu(),
    "elapsed_ms_nonnegative": elapsed_ms >= 0.0,
}
torch.save(results, sys.argv[1])
print("saved", sorted(results), "to", sys.argv[1])
