#!/usr/bin/env bash
# The oracle (ref_forward.py) against the reference engine's goldens, one architecture each
# (llama, qwen2, gemma2 with its window and soft caps, phi3 with its fused tensors; llama in Q8_0): its first case,
# top-10 logits at every prompt position and 8 greedy tokens. The oracle is what test_e2e's
# OracleTest checks qwen3 and gemma3 against (no reference golden exists for them). Exit 77
# (skipped) where none of these goldens is at hand.
set -euo pipefail
shared="${1:?usage: $0 SHARED_DIR [PYTHON]}"
python="${2:-python3}"
oracle="$(dirname "$0")/ref_forward.py"
checked=0
# (synth-llama-q8_0: the oracle's Q8_0 decode, exact weights against the reference's int8
# activations, so the quantized types' bound, 0.05 of max|logit|.)
for f in synth-llama-f32 synth-qwen2-f32 extra/synth-gemma2-f32 extra/synth-phi3-f16 synth-llama-q8_0; do
  [ -f "$shared/models/$f.golden.json" ] || { echo "$f: absent, skipped"; continue; }
  echo "== $f"
  rtol=(); [[ "$f" == *q8_0 ]] && rtol=(--rtol 0.05)
  "$python" "$oracle" "$shared/models/$f.gguf" --check-golden "$shared/models/$f.golden.json" --cases 1 --greedy 8 "${rtol[@]}"
  checked=$((checked + 1))
done
[ "$checked" -gt 0 ] || { echo "no reference golden at hand ($shared/models): skipped"; exit 77; }
