#!/usr/bin/env bash
# Ours vs llama.cpp (../shared/reference) on TinyLlama-1.1B-shaped files, back to back in one run:
# prefill (pp512) and decode (tg32) per weight type and per instruction set this CPU has, then
# the isolated TTFT of a ~960-token prompt through both servers. Prints markdown rows.
#   docs/bench/vs_llamacpp.sh [TYPES...]        (default: q4_0 q8_0 q4_k_m f16; also bf16, ...)
# Env: MODELS (dir for the generated files, default /tmp/ft-models), ISAS (default: all this
# CPU runs), THREADS (2), SERVE=0 skips the server comparison, SERVE_TYPE its file (q4_0).
# Each of our ISA levels is compared with llama.cpp's build for the same level (FT_ISA=avx2 with
# its haswell backend, avx_vnni with alderlake, avx512 and avx512_bf16 with the best this CPU runs: icelake, or
# sapphirerapids with its AMX kernels where the CPU has AMX, as a user gets it): the reference loads the
# best libggml-cpu-*.so found beside its executable, so each level runs from a folder holding a
# copy of llama-bench and only that backend (the other libraries linked). The servers' TTFT
# compares both engines at their best level.
set -euo pipefail
cd "$(dirname "$0")/../.."
FT=build/firsttoken
R=${FT_SHARED_DIR:-../shared}/reference
M=${MODELS:-/tmp/ft-models}
T=${THREADS:-2}
TYPES=("$@"); [ ${#TYPES[@]} -gt 0 ] || TYPES=(q4_0 q8_0 q4_k_m f16)
ISAS=${ISAS:-$($FT bench peak -t 1 | awk 'NR>1 && $1=="1" {print $2}')}
[ -x "$R/llama-bench" ] || { echo "no reference engine at $R" >&2; exit 1; }
mkdir -p "$M"
# llama-bench restricted to one ggml CPU backend: a folder with a copy of the executable (its
# directory is where ggml looks; a symlink would resolve back to $R) and only that backend.
ref_bench() {  # isa -> path of a llama-bench that loads the matching backend
  local level
  case "$1" in
    avx2) level=haswell ;;
    avx_vnni) level=alderlake ;;
    *) echo "$R/llama-bench"; return ;;  # avx512: the best the reference loads here
  esac
  [ -f "$R/libggml-cpu-$level.so" ] || { echo "$R/llama-bench"; return; }
  local d="${TMPDIR:-/tmp}/ft-llama-$level"
  mkdir -p "$d"
  cp -f "$R/llama-bench" "$d/"
  for l in "$R"/lib*.so; do
    case "$(basename "$l")" in libggml-cpu-*) continue ;; esac
    ln -sf "$(realpath "$l")" "$d/"
  done
  ln -sf "$(realpath "$R/libggml-cpu-$level.so")" "$d/"
  echo "$d/llama-bench"
}

echo "| file | ISA | prefill ours t/s | llama.cpp | ratio | % of ceiling | decode ours t/s | llama.cpp | ratio | % of bandwidth |"
echo "|---|---|---|---|---|---|---|---|---|---|"
for t in "${TYPES[@]}"; do
  f="$M/tinyllama-$t.gguf"
  [ -f "$f" ] || $FT make-model --shape tinyllama-1.1b --type "$t" -o "$f" >/dev/null
  for isa in $ISAS; do
    [ "$isa" = scalar ] && continue
    ours=$(FT_ISA=$isa $FT bench model -m "$f" -p 512 -n 32 -r 2 -t "$T" | grep '^|')
    lb=$(ref_bench "$isa")
    "$lb" -m "$f" -t "$T" -p 1 -n 0 -r 1 -v 2>&1 >/dev/null | grep -m1 'loaded CPU backend' >&2 || true
    ref=$("$lb" -m "$f" -t "$T" -p 512 -n 32 -r 2 -o csv 2>/dev/null | tail -2 |
          python3 -c 'import sys,csv; print(" ".join(r[-2] for r in csv.reader(sys.stdin)))')
    python3 - "$t" "$isa" "$ours" "$ref" <<'PY'
import sys
t, isa, ours, ref = sys.argv[1:]
f = [x.strip() for x in ours.split('|')]
opp, otg = float(f[2]), float(f[4])
lpp, ltg = map(float, ref.split())
print(f"| {t} | {isa} | {opp:.1f} | {lpp:.1f} | {opp/lpp:.2f} | {f[3]} | {otg:.2f} | {ltg:.2f} | {otg/ltg:.2f} | {f[5]} |")
PY
  done
done

[ "${SERVE:-1}" = 0 ] && exit 0
# Isolated TTFT through the servers: ~960 random token ids, streamed, max_tokens 1, median of 3.
ST=${SERVE_TYPE:-q4_0}
f="$M/tinyllama-$ST.gguf"
[ -f "$f" ] || $FT make-model --shape tinyllama-1.1b --type "$ST" -o "$f" >/dev/null
ttft() {  # port model -> "t1 t2 t3 median"
  python3 - "$1" "$2" <<'PY'
import json, random, sys, time, urllib.request
port, model = sys.argv[1], sys.argv[2]
def one(n):
    ids = [random.randint(100, 31000) for _ in range(n)]
    body = json.dumps({"model": model, "prompt": ids, "max_tokens": 1, "stream": True}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body, {"Content-Type": "application/json"})
    t0 = time.time()
    with urllib.request.urlopen(req, timeout=600) as resp:
        for line in resp:
            if line.startswith(b"data:"):
                dt = time.time() - t0
                break
        for _ in resp: pass
    return dt
one(16)  # warm-up
xs = [one(960) for _ in range(3)]
print(" ".join(f"{x:.2f}" for x in xs), f"{sorted(xs)[1]:.2f}")
PY
}
wait_up() { for _ in $(seq 120); do curl -sf "localhost:$1/health" >/dev/null && return; sleep 1; done; }
$FT serve -m "$f" --port 8390 -c 4096 -t "$T" >/dev/null 2>&1 & P=$!; wait_up 8390
ours=$(ttft 8390 "$(basename "$f" .gguf)"); kill $P; wait $P || true
"$R/llama-server" -m "$f" -t "$T" -c 4096 -np 1 --port 8391 >/dev/null 2>&1 & P=$!; wait_up 8391
ref=$(ttft 8391 m); kill $P; wait $P || true
python3 - "$ours" "$ref" "$ST" <<'PY'
import sys
o, r = sys.argv[1].split(), sys.argv[2].split()
print(f"TTFT ~960 tokens, {sys.argv[3]}: firsttoken {o[-1]} s ({', '.join(o[:-1])}), llama-server {r[-1]} s ({', '.join(r[:-1])}): ratio {float(o[-1])/float(r[-1]):.2f}")
PY
