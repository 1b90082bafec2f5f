#!/usr/bin/env bash
# The GPU measurements fslab still lacks, in one command on a machine with one GPU:
#
#     bash benchmarks/gpu_pending.sh OUT [parity|studies|all] [SECONDS]
#
# parity   bf16 + compile against fp32 on the miniImageNet-sized stand-in: NCA with a ResNet-12,
#          3 seeds of each, all six runs at once on the GPU (runs_per_gpu = 6), then `fslab compare`
#          of the two sweeps, paired over the same test episodes.
# studies  `python benchmarks/bench_studies.py` for the studies not yet timed on a GPU.
#
# Its results go to OUT (created): parity.txt (the runs and the comparison),
# parity.json, bench_studies.txt and .jsonl. SECONDS (default 560) bounds the whole; a stage cut
# short keeps what it wrote. The runs are made in a project of their own under OUT/project
# (checkpoints included: leave them out when copying OUT). DEVICE (default cuda) is the device of
# every run and of the studies' timings; on a machine without a CUDA GPU the script stops at once
# unless DEVICE=cpu asks for a try on the CPU, made small:
#     DEVICE=cpu BACKBONE=conv4 DATASET=synthetic EPOCHS=1 SLOTS="cpu_slots = 2" SEEDS=2 \
#     STUDIES=map-table2 BENCH_ARGS="--image-size 16 --batch-size 16 --steps 1 --warmup 0 \
#     --train-images 64 --eval-images 32" bash benchmarks/gpu_pending.sh /tmp/pending
set -uo pipefail
[ $# -ge 1 ] || { echo "error: usage: bash benchmarks/gpu_pending.sh OUT [parity|studies|all] [SECONDS]" >&2; exit 2; }
out=$1
stage=${2:-all}
limit=${3:-560}
[[ $limit =~ ^[0-9]+$ ]] && [ "$limit" -ge 120 ] || { echo "error: SECONDS must be a whole number of at least 120, got '$limit'" >&2; exit 2; }
case $stage in parity|studies|all) ;; *) echo "error: stage must be parity, studies or all, got '$stage'" >&2; exit 2;; esac
device=${DEVICE:-cuda}
case $device in
    cpu) ;;
    cuda|cuda:[0-9]*)
        python3 -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' || {
            echo "error: DEVICE=$device but torch sees no CUDA GPU on this machine; run it where there is one, or set DEVICE=cpu and the small settings of the script's comment for a try on the CPU" >&2
            exit 2; } ;;
    *) echo "error: DEVICE must be cuda, cuda:N or cpu, got '$device'" >&2; exit 2;;
esac
repo=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out" && out=$(cd "$out" && pwd)
start=$(date +%s)
left() { echo $(( limit - ($(date +%s) - start) )); }
export PYTHONUNBUFFERED=1

if [ "$stage" != studies ]; then
    project=$out/project
    mkdir -p "$project" && cd "$project" || exit 1
    printf '[scheduler]\n%s\n' "${SLOTS:-runs_per_gpu = 6}" > fslab.toml
    common=(nca --backbone "${BACKBONE:-resnet12}" --dataset "${DATASET:-synthetic-mini}" --epochs "${EPOCHS:-3}"
            --seeds "${SEEDS:-3}" --device "$device")
    bf16=$(fslab sweep "${common[@]}" --set train.precision=bf16 --set train.compile=default | cut -d: -f1)
    fp32=$(fslab sweep "${common[@]}" --set train.precision=fp32 --set train.compile=off | cut -d: -f1)
    [ -n "$bf16" ] && [ -n "$fp32" ] || { echo "error: the parity sweeps could not be queued (fslab said why above)" >&2; exit 1; }
    echo "parity: sweeps $bf16 (bf16 + compile) and $fp32 (fp32), waiting at most $(( $(left) - 60 )) s"
    timeout $(( $(left) - 60 )) python3 - "$bf16" "$fp32" <<'EOF'
import json, subprocess, sys, time
while True:  # until no run of the two sweeps is queued or running
    states = {}
    for sweep in sys.argv[1:]:
        listed = subprocess.run(["fslab", "runs", "--all", "--json", "--sweep", sweep], capture_output=True, text=True)
        for line in listed.stdout.splitlines():
            state = json.loads(line)["state"]
            states[state] = states.get(state, 0) + 1
    print(time.strftime("%H:%M:%S"), states, flush=True)
    if not states.get("queued") and not states.get("running"):
        break
    time.sleep(10)
EOF
    { fslab runs --all --wide
      fslab compare "$bf16" "$fp32"
      fslab compare "$bf16" "$fp32" --format md; } 2>&1 | tee "$out/parity.txt"
    fslab compare "$bf16" "$fp32" --format json > "$out/parity.json" 2>&1
    cd "$repo" || exit 1
fi

if [ "$stage" != parity ] && [ "$(left)" -le 0 ]; then
    echo "studies: not timed, none of the $limit s is left" >&2  # timeout 0 would set no limit at all
elif [ "$stage" != parity ]; then
    # shellcheck disable=SC2086  # BENCH_ARGS is a list of options
    timeout "$(left)" python3 benchmarks/bench_studies.py ${STUDIES:-nca-fig4 nca-table4 sen-table2 nca-table3 nca-supcon nca-fig2 nca-fig3} \
        --device "$device" ${BENCH_ARGS:-} --json "$out/bench_studies.jsonl" 2>&1 | tee "$out/bench_studies.txt"
fi
echo "done in $(( $(date +%s) - start )) s"
