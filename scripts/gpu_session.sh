#!/usr/bin/env bash
# One device call's work, side by side: `make test-gpu` and the fp16 zoo, everything written
# under $OUT (test logs, the zoo's results and logs), within a time limit.
#
#   bash scripts/gpu_session.sh SECONDS [zoo arguments...]
#   e.g. bash scripts/gpu_session.sh 500 --family tv --jobs 4
#        bash scripts/gpu_session.sh 500 --family timm,hf --full --no-tests
#        bash scripts/gpu_session.sh 500 --family tv --bf16 --no-tests   (bfloat16, results apart)
#
# The zoo starts no model in the last 40% of the time (--deadline) and gives each model at most
# a third of it. A results file from an earlier call is resumed (its models are not run again):
# copy $OUT/zoo/results.jsonl to build-zoo/results.jsonl (ignored) and pass carry:
# [".whl", "build-zoo"]. Runs worth keeping across checkouts are in bench/results/ (copy one to
# build-zoo/results.jsonl to resume from it). KILN_SERVER=0 for the zoo: each model compiles once, so a stage server
# would only take cores. Start the call's command with the install line wheels.sh prints.
set -uo pipefail

limit=${1:?usage: gpu_session.sh SECONDS [zoo arguments...]}
shift
tests=1
zoo_args=()
dtype=float16
for arg in "$@"; do
    case "$arg" in
        --no-tests) tests=0 ;;
        --bf16) dtype=bfloat16 ;;
        *) zoo_args+=("$arg") ;;
    esac
done
out=${OUT:?run on the device machine, where \$OUT is set}
export PYTHONUNBUFFERED=1
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>&1)

if [ "$tests" = 1 ]; then
    (echo "on: $gpu" > "$out/test-gpu.log"
     timeout $((limit - 10)) make test-gpu GPU_TEST_ARGS="--jobs 6 --logs /tmp/gpu-tests" >> "$out/test-gpu.log" 2>&1
     echo "exit $?" >> "$out/test-gpu.log") &
fi

# results of each dtype apart: build-zoo/results.jsonl (float16), results-bfloat16.jsonl
results=results.jsonl
[ "$dtype" = float16 ] || results=results-$dtype.jsonl
mkdir -p /tmp/zoo "$out/zoo"
resume=()
if [ -f "build-zoo/$results" ]; then
    cp "build-zoo/$results" /tmp/zoo/results.jsonl
    resume=(--resume)
fi
echo "on: $gpu" > "$out/zoo.log"
KILN_SERVER=0 timeout $((limit - 10)) python3 scripts/zoo.py --target cuda --dtype "$dtype" --latency \
    --timeout $((limit / 3)) --deadline $((limit * 6 / 10)) --out /tmp/zoo "${resume[@]}" "${zoo_args[@]}" \
    >> "$out/zoo.log" 2>&1
cp /tmp/zoo/results.jsonl "$out/zoo/$results" 2>/dev/null
wait
# Note: what comes back from $OUT is limited in its count of files (8 came back, on 2026-12-07;
# the zoo's results were left out behind a call's other files), so the logs travel as one
# archive each (a run's results.jsonl was once left out behind 47 test logs).
tar -czf "$out/zoo/logs.tgz" -C /tmp/zoo logs 2>/dev/null
[ -d /tmp/gpu-tests ] && tar -czf "$out/gpu-tests.tgz" -C /tmp gpu-tests
tail -n 3 "$out/test-gpu.log" 2>/dev/null
tail -n 4 "$out/zoo.log"
