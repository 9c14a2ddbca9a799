# Seed: 003_37eb66e7867da9df.txt (pattern_fusion_pass off, 使用方法): code verbatim, only the
# web page's line-number gutter removed. The seed calls it a fragment that cannot be copied
# and run as is (仅供参考不支持直接拷贝运行): it uses `torch` and `model` without defining them.
import torch_npu
import torchair
config = torchair.CompilerConfig()
# FX图中算子融合Pass配置
config.experimental_config.pattern_fusion_pass = False
npu_backend = torchair.get_npu_backend(compiler_config=config)
opt_model = torch.compile(model, backend=npu_backend)
