#!/usr/bin/env bash
# Everything torchair checks on a lent GPU, in one call (about 7 minutes on an H200), each step
# bounded by its own timeout (T_<STEP> seconds) so that a hang costs one step, not the lease. The
# limits add up to more than a 10-minute call: the CPU suite, last, is the step a slow machine
# cuts short.
#   0. the C++ launch library's error check (bench/gpu_launch_probe.sh: a native backtrace
#      under cuda-gdb when it fails, as every raised ValueError did on the first lent H200);
#   1. the served step against its CUDA graph replay's own host time (bench/bench_gpu_step.py:
#      eager, cache_compile, torch.compile, reduce-overhead; persistent and fresh input buffers);
#      then the tests marked `cuda` (compiled Triton kernels against the references, CUDA
#      graphs), CUDA_TESTS (default: tests) narrowing them;
#   2. `torchair demo` on CUDA (tokens graph == eager, speed, CUDA graphs per gear);
#   3. the decode step on CUDA (eager / inductor / torchair paths / reduce-overhead);
#   4. decode attention on CUDA: the Triton kernel's K+V bandwidth vs the measured copy
#      bandwidth and vs SDPA;
#   5. the static compile report of every Triton kernel for the GPU's architecture;
#   6. `torchair demo --experts` (MoE through the torch_npu MoE ops) and the vllm-ascend-style
#      decode script (examples/peer/vllm_ascend_decode.py) under `torchair run --device cuda`;
#   7. the CPU suite under the machine's own PyTorch (2.11 there: the oldest we support);
#      CPU_TESTS (default: tests) narrows it to the files a change touched.
# SKIP="step step" leaves steps out (their names as printed, e.g. SKIP="decode_attention").
# Results go to $OUT (the device tool's output folder, at most 8 files come back) or
# bench/results/gpu: log.txt holds every step's whole output, the JSON files beside it; copy them
# into bench/results/ afterwards. Runs from the repository root with the machine's own
# torch/triton (no install step: the GPU machines cannot reach a package index).
set -u
cd "$(dirname "$0")/.."
out=${OUT:-bench/results/gpu}
mkdir -p "$out"
log="$out/log.txt"
: > "$log"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
unset TRITON_INTERPRET
status=0
step_out=$(mktemp)
run() {  # run NAME SECONDS CMD...: bounded, whole output appended to the log, tail shown
    local name=$1 limit=$2; shift 2
    case " ${SKIP:-} " in *" $name "*) echo "== $name: skipped (SKIP)"; return 0;; esac
    local start=$SECONDS
    echo "== $name: $*"
    echo "===== $name: $*" >> "$log"
    timeout -k 5 "$limit" "$@" 2>&1 | tee -a "$log" > "$step_out"  # streamed: a killed call keeps it
    local rc=${PIPESTATUS[0]}
    echo "===== $name: exit $rc after $((SECONDS - start)) s" >> "$log"
    tail -n "${TAIL:-12}" "$step_out"
    echo "== $name: exit $rc after $((SECONDS - start)) s"
    [ "$rc" -eq 0 ] || status=1
}
run environment 60 python3 -c "import torch, triton, platform, os
print('python', platform.python_version(), 'torch', torch.__version__, 'triton', triton.__version__)
print('cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '-')
p = torch.cuda.get_device_properties(0); print('sm', p.major, p.minor, 'SMs', p.multi_processor_count, 'cpus', os.cpu_count())"
arch=$(timeout 60 python3 -c "import torch; p = torch.cuda.get_device_properties(0); print(p.major * 10 + p.minor)")
# pytest-xdist spreads the suites over the cores where it is installed (it cannot be installed
# on a machine without a package index); without it they run in one process
xdist() { timeout 30 python3 -c "import xdist" 2>/dev/null && echo "-n $1 ${2:-}"; }
TAIL=40 run launch_probe "${T_PROBE:-120}" bash bench/gpu_launch_probe.sh
run gpu_step "${T_GPUSTEP:-300}" python3 -m bench.bench_gpu_step ${GPUSTEP_ARGS:-} --out "$out/gpu_step_cuda.json"
TAIL=30 run pytest_cuda "${T_CUDA:-180}" python3 -m pytest -q -m cuda -p no:cacheprovider -rfE \
    $(xdist 4 "--dist loadfile") --continue-on-collection-errors ${CUDA_TESTS:-tests}
run demo "${T_DEMO:-70}" python3 -m torchair demo --device cuda --batch 1 4 --steps 16 --no-progress \
    --json "$out/demo_cuda.json"
# reduce-overhead is left out: its first call took 57 s on the first lent H200
run decode_step "${T_STEP:-120}" python3 -m bench.bench_decode_step --device cuda --rounds 10 \
    --variants eager torchair torchair-fx torchair-nodynamo --profile-steps 5 --warm-cache \
    --out "$out/decode_step_cuda.json"
run decode_attention "${T_ATTN:-45}" python3 -m bench.bench_decode_attention --device cuda --quick \
    --out "$out/decode_attention_cuda.json"
run triton_static "${T_STATIC:-30}" python3 -m torchair.ops.toolchain.triton_aot --arch "$arch" \
    --json "$out/triton_sm${arch}_static.json"
run demo_moe "${T_MOE:-60}" python3 -m torchair demo --device cuda --batch 1 4 --steps 8 \
    --experts 4 --top-k 2 --no-progress --json "$out/demo_moe_cuda.json"
run ascend_script "${T_SCRIPT:-90}" python3 -m torchair run --device cuda \
    examples/peer/vllm_ascend_decode.py --cache-dir "$(mktemp -d)"
TAIL=25 run cpu_suite "${T_CPU:-200}" python3 -m pytest -q -m "not cuda and not inductor" \
    -p no:cacheprovider -rfE $(xdist 12) ${CPU_TESTS:-tests}
rm -f "$step_out"
exit $status
