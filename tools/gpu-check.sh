#!/usr/bin/env bash
# Everything the NVIDIA GPU machine should check, in one go (see docs/performance.md):
#   here:  tools/gpu-check.sh build      -> builds build-gpu/ (release), ready to carry
#   there: tools/gpu-check.sh run        -> tests (CUDA, Vulkan on the NVIDIA driver, conformance),
#          compute-sanitizer memcheck, devices, demo on each backend, bench; short table last.
# The GPU machine has no meson of this version and no Vulkan loader: the build travels as
# build-gpu/ (plus .gl/ with Debian's libvulkan1), tests run from `meson introspect --tests`.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
build=build-gpu

if [ "${1:-}" = build ]; then
    set -e
    [ -f $build/build.ninja ] || meson setup $build -Dbuildtype=release
    ninja -C $build
    meson introspect $build --tests > $build/tests.json
    # Objects are not needed to run; keep what travels small.
    find $build -name '*.o' -delete
    du -sh $build
    exit 0
fi
mode=${1:-}
[ "$mode" = run ] || [ "$mode" = conformance ] || [ "$mode" = tests ] || [ "$mode" = multidevice ] ||
    [ "$mode" = kernels ] || [ "$mode" = perf ] ||
    { echo "usage: tools/gpu-check.sh build|run|conformance|tests|multidevice|kernels|perf" >&2; exit 2; }

OUT=${OUT:-/tmp/gpu-check}
mkdir -p "$OUT"
# Absolute paths in the build (test commands, BACKPLANE_BUILD_ROOT) point at the development
# machine's checkout; make that path lead here.
if [ ! -e /work/main ]; then mkdir -p /work && ln -s "$root" /work/main; fi
for f in .gl/*.deb; do dpkg -x "$f" /; done
ldconfig
# NVIDIA's GLX ICD fails headless; its EGL library serves Vulkan without a display.
printf '{"file_format_version":"1.0.1","ICD":{"library_path":"/usr/local/nvidia/lib64/libEGL_nvidia.so.0","api_version":"1.4.312"}}' > /tmp/egl_icd.json
export VK_DRIVER_FILES=/tmp/egl_icd.json
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export BACKPLANE_CACHE_DIR=/tmp/backplane-cache
tool=/work/main/$build/tools/backplane/backplane
sanitizer=/usr/local/cuda/bin/compute-sanitizer
sanitizer_args=(--tool memcheck --report-api-errors no --error-exitcode 9)

nvidia-smi -L
# `kernels`: the portable kernels on CUDA and Vulkan (suite kernels: differential, NVRTC), the
# whole conformance suite (portable saxpy; ABI 1.2), the demo per backend, bench kernels.
if [ "$mode" = kernels ]; then
    python3 tools/run-introspected-tests.py /work/main/$build/tests.json "$OUT/tests.log" \
        --suite kernels | tee "$OUT/summary.txt"
    grep -E -B3 -A20 "ERROR|FATAL|CRASHED" "$OUT/tests.log" | head -150 >> "$OUT/summary.txt"
    $tool conformance --plugin cuda --plugin vulkan --plugin host > "$OUT/conformance.txt" 2>&1
    echo "conformance (all cases): rc=$? $(grep -E '^[a-z]+: passes' "$OUT/conformance.txt" | tr '\n' ' ')" |
        tee -a "$OUT/summary.txt"
    for backend in cuda vulkan; do
        timeout 300 $tool demo --device $backend > "$OUT/demo-$backend.txt" 2>&1
        echo "demo $backend: rc=$? $(grep -E '^(PASS|FAIL)' "$OUT/demo-$backend.txt")" | tee -a "$OUT/summary.txt"
    done
    timeout 500 $tool bench kernels > "$OUT/bench-kernels.txt" 2>&1
    echo "bench kernels: rc=$?" | tee -a "$OUT/summary.txt"
    exit 0
fi
# `perf`: recorded sequences and the performance rows (issue 15): suites replay, cuda and vulkan
# (graphs of both plugins), the conformance graph cases, the randomized engine model with replays
# on CUDA and Vulkan, bench engine / cuda / vulkan, and the staging sweep of bench transfers.
# PART=tests or PART=bench runs one half (each fits one 10-minute device call).
if [ "$mode" = perf ] && [ "${PART:-all}" != bench ]; then
    python3 tools/run-introspected-tests.py /work/main/$build/tests.json "$OUT/tests.log" \
        --suite replay --suite cuda --suite vulkan | tee "$OUT/summary.txt"
    grep -E -B3 -A20 "ERROR|FATAL|CRASHED" "$OUT/tests.log" | head -100 >> "$OUT/summary.txt"
    $tool conformance --plugin cuda --plugin vulkan --plugin host > "$OUT/conformance.txt" 2>&1
    echo "conformance: rc=$? $(grep -E '^[a-z]+: passes' "$OUT/conformance.txt" | tr '\n' ' ')" |
        tee -a "$OUT/summary.txt"
    grep -E "graph\." "$OUT/conformance.txt" | head -30 >> "$OUT/summary.txt"
    model=/work/main/$build/tests/engine/engine_model_test
    for p in cuda vulkan; do
        BACKPLANE_LOG=off BACKPLANE_MODEL_PLUGIN=$p \
            BACKPLANE_MODEL_LIBRARY=/work/main/$build/plugins/$p/libbackplane_$p.so \
            BACKPLANE_MODEL_SECONDS=15 BACKPLANE_MODEL_THREADS=8 BACKPLANE_MODEL_STREAMS=12 \
            timeout 120 $model > /tmp/model-$p.log 2>&1
        echo "model $p (8 threads x 12 streams, 15 s, with replays): rc=$? $(grep -E '^model: plugin=' /tmp/model-$p.log)" |
            tee -a "$OUT/summary.txt"
        grep -E "^(error|mismatch)" /tmp/model-$p.log | head -5 >> "$OUT/summary.txt"
    done
    [ "${PART:-all}" = tests ] && exit 0
fi
if [ "$mode" = perf ]; then
    # The staging sweep first; the bench rows then run with its best setting for both
    # directions (a config file with those four keys), which the summary names.
    timeout 240 $tool bench transfers --device cuda:0 > "$OUT/sweep.txt" 2> /tmp/sweep-notes.txt
    echo "bench transfers (sweep) rc=$?" | tee -a "$OUT/summary.txt"
    cat /tmp/sweep-notes.txt | tee -a "$OUT/summary.txt"
    best=$(grep -oE 'staging_chunk_bytes [0-9]+, staging_ring_depth [0-9]+, staging_copy_threads [0-9]+, staging_streaming_stores [a-z]+' /tmp/sweep-notes.txt | head -1)
    if [ -n "$best" ]; then
        set -- $(echo "$best" | tr -d ',')
        printf '{"memory": {"staging_chunk_bytes": %s, "staging_ring_depth": %s, "staging_copy_threads": %s, "staging_streaming_stores": %s}}\n' \
            "$2" "$4" "$6" "$8" > /tmp/staging.json
        export BACKPLANE_CONFIG=/tmp/staging.json
        echo "bench with $(cat /tmp/staging.json)" | tee -a "$OUT/summary.txt"
    fi
    timeout 420 $tool bench cuda engine vulkan > "$OUT/bench.txt" 2> /tmp/bench-notes.txt
    echo "bench rc=$?" | tee -a "$OUT/summary.txt"
    cat /tmp/bench-notes.txt >> "$OUT/bench.txt"
    exit 0
fi
# `multidevice` (2 x H200 or more): the multidevice suite, NCCL in one process and in one process
# per GPU (TCP and shared-directory rendezvous), the staged path, the multidevice bench rows.
if [ "$mode" = multidevice ]; then
    export NCCL_NVLS_ENABLE=0 # NVLink multicast must stay off on the shared hosts (DEVICE.md)
    export BACKPLANE_NCCL_LIBRARY=${BACKPLANE_NCCL_LIBRARY:-/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2}
    gpus=$(nvidia-smi -L | wc -l)
    # At most 8 files come back: demo logs of the ranks stay in /tmp, the rest is appended.
    nvidia-smi topo -m > "$OUT/summary.txt" 2>&1
    $tool devices > "$OUT/devices.txt" 2>&1
    sed -n '/^Collectives/,/^$/p' "$OUT/devices.txt" | tee -a "$OUT/summary.txt"
    python3 tools/run-introspected-tests.py /work/main/$build/tests.json "$OUT/tests.log" \
        --suite multidevice | tee -a "$OUT/summary.txt"
    grep -E -B3 -A12 "ERROR|FATAL|CRASHED" "$OUT/tests.log" | head -120 >> "$OUT/summary.txt"
    $tool conformance --plugin cuda --case collectives --case peer > "$OUT/conformance.txt" 2>&1
    echo "conformance cuda (collectives, peer): rc=$? $(tail -1 "$OUT/conformance.txt")" | tee -a "$OUT/summary.txt"
    list=$(seq -s, -f 'cuda:%g' 0 $((gpus - 1)))
    timeout 300 $tool demo --devices "$list" > "$OUT/demo.txt" 2>&1
    echo "demo --devices $list (one process): rc=$?" | tee -a "$OUT/summary.txt"
    # The TCP rendezvous admits only processes that know the job's token.
    BACKPLANE_RENDEZVOUS_TOKEN=$($tool token)
    export BACKPLANE_RENDEZVOUS_TOKEN
    for rdv in tcp:127.0.0.1:29533 dir:/tmp/bp-rdv-$$; do
        pids=()
        for r in $(seq 0 $((gpus - 1))); do
            BACKPLANE_RANK=$r BACKPLANE_WORLD_SIZE=$gpus BACKPLANE_RENDEZVOUS=$rdv \
                timeout 300 $tool demo --devices cuda:$r > "/tmp/demo-$r.txt" 2>&1 &
            pids+=($!)
        done
        rcs=""
        for p in "${pids[@]}"; do wait "$p"; rcs="$rcs $?"; done
        echo "demo, one process per GPU ($rdv): rc=$rcs" | tee -a "$OUT/summary.txt"
        cat /tmp/demo-*.txt >> "$OUT/demo.txt"
    done
    timeout 300 $tool demo --devices all >> "$OUT/demo.txt" 2>&1
    echo "demo --devices all: rc=$?" | tee -a "$OUT/summary.txt"
    grep -E "^(rank|engine|all-reduce|PASS|FAIL)" "$OUT/demo.txt" | tee -a "$OUT/summary.txt"
    timeout 400 $tool bench multidevice > "$OUT/bench.txt" 2> /tmp/bench-notes.txt
    echo "bench multidevice rc=$?" | tee -a "$OUT/summary.txt"
    cat /tmp/bench-notes.txt >> "$OUT/bench.txt"
    cat "$OUT/bench.txt" | tee -a "$OUT/summary.txt"
    exit 0
fi
# `tests`: only the GPU plugins' test suites (CUDA, Vulkan on the NVIDIA driver, conformance).
if [ "$mode" = tests ]; then
    python3 tools/run-introspected-tests.py /work/main/$build/tests.json "$OUT/tests.log" \
        --suite cuda --suite vulkan --suite conformance | tee "$OUT/tests.txt"
    exit 0
fi
# `conformance`: only the plugin conformance suite on CUDA and Vulkan (docs/conformance.md), as
# tables and JSON; the tables go to docs/measurements/.
if [ "$mode" = conformance ]; then
    for p in cuda vulkan host; do
        $tool conformance --plugin $p > "$OUT/conformance-$p.txt" 2>&1
        echo "conformance $p: rc=$?" | tee -a "$OUT/conformance-summary.txt"
        $tool conformance --plugin $p --json > "$OUT/conformance-$p.json" 2>/dev/null
    done
    if [ -x $sanitizer ]; then
        timeout 500 $sanitizer "${sanitizer_args[@]}" --target-processes all \
            $tool conformance --plugin cuda --timeout 300 > "$OUT/memcheck-conformance.log" 2>&1
        echo "memcheck conformance(cuda): rc=$? $(grep -E 'ERROR SUMMARY' "$OUT/memcheck-conformance.log" | tail -1)" | tee -a "$OUT/conformance-summary.txt"
    fi
    tail -n 3 "$OUT"/conformance-*.txt
    exit 0
fi
# Cold (no probe cache: every plugin probed in a backplane-probe child), then warm.
rm -rf /tmp/backplane-cache
for start in cold warm; do
    t0=$(date +%s%N); $tool devices > "$OUT/devices-$start.txt" 2>&1; t1=$(date +%s%N)
    echo "backplane devices ($start probe cache): $(( (t1 - t0) / 1000000 )) ms" | tee -a "$OUT/startup.txt"
done
cat "$OUT/devices-warm.txt"
$tool devices --json > "$OUT/devices.json"

python3 tools/run-introspected-tests.py /work/main/$build/tests.json "$OUT/tests.log" \
    --suite cuda --suite vulkan --suite conformance --suite core --suite host --suite streams \
    | tee "$OUT/tests.txt"

# Memory errors only: the CUDA plugin learns a kernel's parameter count by asking
# cuFuncGetParamInfo one index past the last (CUDA_ERROR_INVALID_VALUE by design), which memcheck
# would count as an API error.
if [ -x $sanitizer ]; then
    timeout 500 $sanitizer "${sanitizer_args[@]}" --target-processes all \
        $tool conformance --plugin cuda --timeout 300 > "$OUT/memcheck.log" 2>&1
    echo "memcheck conformance(cuda): rc=$? $(grep -E 'ERROR SUMMARY' "$OUT/memcheck.log" | tail -1)" | tee -a "$OUT/tests.txt"
    tail -5 "$OUT/memcheck.log"
fi

# The randomized engine test, longer and wider than in the test list: CUDA streams and Vulkan's
# several queues are where cross-stream hazards run concurrently on a device.
model=/work/main/$build/tests/engine/engine_model_test
for p in cuda vulkan; do
    lib=/work/main/$build/plugins/$p/libbackplane_$p.so
    BACKPLANE_LOG=off BACKPLANE_MODEL_PLUGIN=$p BACKPLANE_MODEL_LIBRARY=$lib BACKPLANE_MODEL_SECONDS=20 \
        BACKPLANE_MODEL_THREADS=8 BACKPLANE_MODEL_STREAMS=12 timeout 200 $model > "$OUT/model-$p.log" 2>&1
    echo "model $p (8 threads x 12 streams, 20 s): rc=$? $(grep -E '^model: plugin=' "$OUT/model-$p.log")" | tee -a "$OUT/tests.txt"
done
if [ -x $sanitizer ]; then
    BACKPLANE_LOG=off BACKPLANE_MODEL_PLUGIN=cuda BACKPLANE_MODEL_LIBRARY=/work/main/$build/plugins/cuda/libbackplane_cuda.so \
        BACKPLANE_MODEL_SECONDS=10 timeout 400 $sanitizer "${sanitizer_args[@]}" $model > "$OUT/memcheck-model.log" 2>&1
    echo "memcheck model(cuda): rc=$? $(grep -E '^model: plugin=' "$OUT/memcheck-model.log") $(grep -E 'ERROR SUMMARY' "$OUT/memcheck-model.log" | tail -1)" | tee -a "$OUT/tests.txt"
fi

for dev in cuda vulkan host; do
    BACKPLANE_DEVICE=$dev timeout 120 $tool demo > /tmp/demo.txt 2>&1
    echo "demo $dev: rc=$? $(tail -1 /tmp/demo.txt)" | tee -a "$OUT/tests.txt"
    cat /tmp/demo.txt >> "$OUT/demo.txt"
done
timeout 300 $tool bench engine cuda vulkan tune startup > "$OUT/bench.txt" 2> /tmp/bench-notes.txt
echo "bench rc=$?"
cat /tmp/bench-notes.txt
echo "================ summary"
cat "$OUT/tests.txt" "$OUT/startup.txt"
cat "$OUT/bench.txt"
