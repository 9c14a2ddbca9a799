#!/usr/bin/env bash
# Where the C++ launch library's errors are checked (torchair/ops/attention/cpu/launch.py,
# errors_reach_python): on the first lent H200 every ValueError it raised killed the process with
# SIGSEGV, and the cause was not established. This prints the toolchain, builds and checks the
# library in a private kernel cache, and, when the check fails, runs the check's child under
# cuda-gdb (the GPU machines have no gdb; gdb elsewhere) for a native backtrace. Called by gpu_check.sh; runs
# anywhere (without a debugger it only prints the verdict).
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export TORCHAIR_KERNEL_CACHE=${TORCHAIR_KERNEL_CACHE:-$(mktemp -d)}
for tool in "${CXX:-c++}" "${CC:-cc}"; do
    echo "$tool: $("$tool" --version 2>&1 | head -n 1)"
done
echo "libc: $(ldd --version 2>&1 | head -n 1)"
echo "kernel: $(uname -r)"
timeout 300 python3 -c "from torchair.ops.attention.cpu import launch
print('launch kernels available:', launch.available())"
verdict=$(ls "$TORCHAIR_KERNEL_CACHE"/launch_ops-*.so.errors 2>/dev/null | head -n 1)
if [ -z "$verdict" ]; then
    echo "no verdict kept (no C++ compiler, or a check that said nothing about the library)"
    exit 0
fi
echo "verdict ($verdict): $(cat "$verdict")"
grep -qx ok "$verdict" && exit 0
debugger=$(command -v cuda-gdb || command -v gdb)
if [ -z "$debugger" ]; then
    echo "neither cuda-gdb nor gdb found: no native backtrace"
    exit 1
fi
# the check's child, in the foreground of a debugger: where the throw goes wrong
TORCHAIR_LAUNCH_PROBE=${verdict%.errors} timeout 240 "$debugger" -batch -ex run -ex bt \
    -ex "info sharedlibrary" --args "$(python3 -c 'import sys; print(sys.executable)')" -c \
    "from torchair.ops.attention.cpu import launch; launch.probe()" 2>&1 | tail -n 80
exit 1
