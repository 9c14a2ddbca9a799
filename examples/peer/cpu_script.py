# The CPU twin of examples/peer/npu_script.py: the same computation written for the CPU,
# without torch_npu (no streams or events: host work is in order). Run it with:
#   python examples/peer/cpu_script.py OUT.pt
import sys

import torch

import torchair
from torchair.configs.compiler_config import CompilerConfig

torch.manual_seed(7)


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(16, 8)

    def forward(self, x, scale):
        y = self.linear(x) * scale
        offset = torch.arange(8) * 0.5
        ones = torch.ones(8)
        y = torch.relu(y + offset) + ones
        res = y.to(torch.float16).float()
        return res, torchair.ops.npu_rms_norm(y, torch.full((8,), 2.0))[0]


config = CompilerConfig()
config.mode = "max-autotune"
config.experimental_config.frozen_parameter = True
config.debug.graph_dump.type = "py"
config.debug.run_eagerly = True
backend = torchair.get_npu_backend(compiler_config=config)

model = Model()
model.eval()
opt_model = torch.compile(model, backend=backend, fullgraph=True)

x = torch.randn(4, 16)
scale = torch.tensor([1.5])

with torch.no_grad():
    out, normed = opt_model(x, scale)
    eager_out, eager_normed = model(x, scale)

torch.manual_seed(11)
noise = torch.randn(4, 8)

results = {
    "out": out,
    "normed": normed,
    "matches_eager": bool(torch.equal(out, eager_out) and torch.equal(normed, eager_normed)),
    "noise": noise,
    "elapsed_ms_nonnegative": True,
}
torch.save(results, sys.argv[1])
print("saved", sorted(results), "to", sys.argv[1])
