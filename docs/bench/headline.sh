#!/bin/bash
# The README's headline numbers (issue 6): a 110m-shaped Q8_0 model, 2 threads, quiet machine.
# Usage: docs/bench/headline.sh [OUT_DIR]   (from the repository root, after scripts/setup.sh)
set -euo pipefail
OUT=${1:-headline}
mkdir -p "$OUT"
export OMP_WAIT_POLICY=passive
M="$OUT/110m-q8_0.gguf"
[ -f "$M" ] || build/firsttoken make-model --shape 110m --type q8_0 \
  --vocab ../shared/tokenizer/ggml-vocab-llama-spm.gguf -o "$M"
# Baselines: short prompts alone, long prompts alone.
build/firsttoken bench ablate -m "$M" --workload short --duration 60 --seed 1 --configs auto,nochunk \
  --slo ttft:500,tpot:100 --out "$OUT/short" --quiet | tee "$OUT/short.txt"
build/firsttoken bench ablate -m "$M" --workload long --duration 60 --seed 1 \
  --configs auto,nochunk,chunk1024,chunk256 --out "$OUT/long" --quiet | tee "$OUT/long.txt"
# The mixed workload against every scheduler configuration.
build/firsttoken bench ablate -m "$M" --workload mixed --duration 120 --seed 1 --slo ttft:500,tpot:100 \
  --out "$OUT/mixed" --quiet | tee "$OUT/mixed.txt"
