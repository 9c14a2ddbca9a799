#!/usr/bin/env bash
# Everything torchair checks on a lent GPU, in one call (about 5 minutes on an H100):
#   1. the tests marked `cuda` (compiled Triton kernels against the references, CUDA graphs);
#   2. decode attention on CUDA: the Triton kernel's K+V bandwidth vs the measured copy
#      bandwidth and vs SDPA (B 1 8 32 x KV 512 4k 32k, fp16 / bf16 / fp32);
#   3. the static compile report of every Triton kernel for the GPU's architecture.
# Results go to $OUT (the device tool's output folder) or bench/results/gpu; copy the JSON into
# bench/results/ afterwards. Runs from the repository root with the machine's own torch/triton
# (no install step: the GPU machines cannot reach a package index).
set -u
cd "$(dirname "$0")/.."
out=${OUT:-bench/results/gpu}
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
unset TRITON_INTERPRET
status=0
run() {  # run "$@", log to $out/<name>.txt, remember a failure, keep going
    local name=$1; shift
    echo "== $name: $*"
    "$@" > "$out/$name.txt" 2>&1
    local rc=$?
    tail -n 25 "$out/$name.txt"
    echo "== $name: exit $rc"
    [ "$rc" -eq 0 ] || status=1
}
run environment python -c "import torch, triton, platform
print('python', platform.python_version(), 'torch', torch.__version__, 'triton', triton.__version__)
print('cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '-')
p = torch.cuda.get_device_properties(0); print('sm', p.major, p.minor, 'SMs', p.multi_processor_count)"
arch=$(python -c "import torch; p = torch.cuda.get_device_properties(0); print(p.major * 10 + p.minor)")
run pytest_cuda python -m pytest -q -m cuda -p no:cacheprovider --continue-on-collection-errors tests
run decode_attention python bench/bench_decode_attention.py --device cuda \
    --out "$out/decode_attention_cuda.json"
run triton_static python -m torchair.ops.toolchain.triton_aot --arch "$arch" \
    --json "$out/triton_sm${arch}_static.json"
exit $status
