# Seed: 002_9b455b0cf40d8ded.txt (调用示例, 单算子调用): code verbatim; the copy joined the
# lines into one, line breaks restored here; the output the seed shows after the code is
# kept as a comment.
# 单算子调用方式
import torch
import torch_npu
import math
# 生成随机数据,并发送到npu
q = torch.randn(2, 1, 40 * 128, dtype=torch.float16).npu()
k = torch.randn(2, 1, 40 * 128, dtype=torch.float16).npu()
v = torch.randn(2, 1, 40 * 128, dtype=torch.float16).npu()
scale = 1/math.sqrt(128.0)
# 调用IFA算子
out = torch_npu.npu_incre_flash_attention(q, k, v, num_heads=40, input_layout="BSH", scale_value=scale)
# 执行上述代码的输出类似如下
# tensor([[[ 0.3149, -0.2460, 0.7939, ..., 0.5737, -0.4929, -0.1500]], [[ 0.8115, 1.3789, 0.6484, ..., -0.9092, -0.6206, -0.7412]]], device='npu:0', dtype=torch.float16)
