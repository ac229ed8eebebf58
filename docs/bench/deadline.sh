#!/bin/bash
# Issue 19's before/after table: scheduling by TTFT deadline against a build of the previous
# scheduler, back to back per workload (110m Q8_0, 2 threads; the 960-token case on the
# tinyllama-1.1b shape, Q4_0). Timings move 15-50% run to run: only ratios within one run count.
# Usage: docs/bench/deadline.sh BASE_FIRSTTOKEN [OUT_DIR]   (from the repository root)
set -euo pipefail
BASE=$1
OUT=${2:-deadline}
mkdir -p "$OUT"
export OMP_WAIT_POLICY=passive
M="$OUT/110m-q8_0.gguf" TL="$OUT/tinyllama-q4_0.gguf"
V=../shared/tokenizer/ggml-vocab-llama-spm.gguf
[ -f "$M" ] || build/firsttoken make-model --shape 110m --type q8_0 --vocab $V -o "$M"
[ -f "$TL" ] || build/firsttoken make-model --shape tinyllama-1.1b --type q4_0 --vocab $V -o "$TL"
cat > "$OUT/one960.json" <<'JSON'
{"name": "one960", "duration_s": 20,
 "classes": [{"name": "long", "arrival": {"type": "periodic", "rate": 0.0833333333}, "prompt_tokens": 960, "output_tokens": 4}]}
JSON
# The built-in `burst`, as a file: the previous build does not know it.
cat > "$OUT/burst.json" <<'JSON'
{"name": "burst", "duration_s": 60,
 "classes": [{"name": "long-a", "arrival": {"type": "periodic", "rate": 0.0333333333}, "prompt_tokens": {"mean": 2700, "spread": 50}, "output_tokens": 16},
             {"name": "long-b", "arrival": {"type": "periodic", "rate": 0.0333333333}, "prompt_tokens": {"mean": 2700, "spread": 50}, "output_tokens": 16}]}
JSON
SA=(--server-arg=-t --server-arg=2 --quiet)
for v in base new; do
  B=build/firsttoken; [ $v = base ] && B=$BASE
  $B bench ablate -m "$M" --workload long --duration 60 --seed 1 --configs auto,nochunk "${SA[@]}" --out "$OUT/$v-long" | tee "$OUT/$v-long.txt"
done
for v in base new; do
  B=build/firsttoken; [ $v = base ] && B=$BASE
  $B bench ablate -m "$M" --workload mixed --duration 60 --seed 1 --slo ttft:500,tpot:100 --configs auto --isolated \
    "${SA[@]}" --out "$OUT/$v-mixed" | tee "$OUT/$v-mixed.txt"
done
for v in base new; do
  B=build/firsttoken; [ $v = base ] && B=$BASE
  $B bench ablate -m "$M" --workload "$OUT/burst.json" --seed 1 --configs auto "${SA[@]}" --out "$OUT/$v-burst" | tee "$OUT/$v-burst.txt"
  $B bench ablate -m "$TL" --workload "$OUT/one960.json" --seed 1 --configs auto,nochunk "${SA[@]}" --out "$OUT/$v-tl960" | tee "$OUT/$v-tl960.txt"
done
grep -h "cost model" "$OUT"/new-mixed/*.server.log
