# Seed: 001_94b5f63cb3001b42.txt (1. 动态分档, 示例): code verbatim; the copy lost the
# indentation of the class body, restored here (no other change).
import torch
import torch_npu
import torchair
class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
    def forward(self, x1, x2):
        return x1 + x2
input1 = torch.ones(2, 2).npu()
input2 = torch.ones(2, 2).npu()
config = torchair.CompilerConfig()
# zip方式,位置一一对应,支持(2, 2)(2, 2)和(4, 2)(4, 2)两种输入组合
config.inference_config.dynamic_gears_merge_policy = "zip" #缺省值
# product方式,排列组合,支持(2, 2)(2, 2)、(2, 2)(4, 2)、(4, 2)(2, 2)和(4, 2)(4, 2)四种输入组合
# config.inference_config.dynamic_gears_merge_policy = "product"
npu_bakcend = torchair.get_npu_backend(compiler_config=config)
model = Model().npu()
# 必须整图编译
model = torch.compile(model, fullgraph=True, backend=npu_bakcend)
# 设置档位
torchair.inference.set_dim_gears(input1, dim_gears={0:[2, 4]})
torchair.inference.set_dim_gears(input2, dim_gears={0:[2, 4]})
# 首次编译+执行,shape为(2, 2)、(2, 2)
print(model(input1, input2))
# 再次执行,shape为(4, 2)、(4, 2)在档位中,不会触发重新编译
input1 = torch.ones(4, 2).npu()
input2 = torch.ones(4, 2).npu()
print(model(input1, input2))
