#!/usr/bin/env bash
# The oracle (ref_forward.py) against the reference engine's goldens, one architecture each
# (llama, qwen2, gemma2 with its window and soft caps, phi3 with its fused tensors): its first case,
# top-10 logits at every prompt position and 8 greedy tokens. The oracle is what test_e2e's
# OracleTest checks qwen3 and gemma3 against (no reference golden exists for them). Exit 77
# (skipped) where ../shared/models is absent.
set -euo pipefail
models="${1:?usage: $0 SHARED_DIR}/models"
oracle="$(dirname "$0")/ref_forward.py"
[ -d "$models" ] || { echo "shared models absent ($models): skipped"; exit 77; }
for f in synth-llama-f32 synth-qwen2-f32 extra/synth-gemma2-f32 extra/synth-phi3-f16; do
  [ -f "$models/$f.golden.json" ] || { echo "$f: absent, skipped"; continue; }
  echo "== $f"
  python3 "$oracle" "$models/$f.gguf" --check-golden "$models/$f.golden.json" --cases 1 --greedy 8
done
