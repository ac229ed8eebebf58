# /v1/embeddings, ours against llama-server (../shared/reference) on the same file, back to back in
# one run: each engine's vectors for the same inputs (cosine similarity: both L2-normalize, so this
# checks the pooled hidden states against an independent implementation), and the latency of
# one request of `--inputs` texts of ~`--tokens` tokens, median of `--rounds` alternated rounds.
# Usage: python3 docs/bench/embeddings_vs_llamacpp.py -m FILE.gguf [--pooling last|mean|cls]
#        [--inputs 8] [--tokens 250] [--rounds 5] [--threads 2] [--ref-slots 1] [--binary build/firsttoken]
import argparse, json, os, re, statistics as st, subprocess, sys, time, urllib.request

ap = argparse.ArgumentParser()
ap.add_argument('-m', '--model', required=True)
ap.add_argument('--pooling', default='last')
ap.add_argument('--inputs', type=int, default=8)
ap.add_argument('--tokens', type=int, default=250)
ap.add_argument('--rounds', type=int, default=5)
ap.add_argument('--threads', type=int, default=2)
ap.add_argument('--ref-slots', type=int, default=1)
ap.add_argument('--binary', default='build/firsttoken')
a = ap.parse_args()
REF = os.path.join(os.environ.get('FT_SHARED_DIR', '../shared'), 'reference', 'llama-server')
CTX = 4096


def start(cmd, ready):
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    t0 = time.time()
    while time.time() - t0 < 300:
        line = p.stderr.readline()
        if not line and p.poll() is not None:
            sys.exit('server exited: ' + ' '.join(cmd))
        m = ready(line)
        if m:
            import threading
            threading.Thread(target=lambda: [None for _ in p.stderr], daemon=True).start()
            return p, m
    sys.exit('server did not start: ' + ' '.join(cmd))


def post(url, body):
    req = urllib.request.Request(url + '/v1/embeddings', data=json.dumps(body).encode(),
                                 headers={'content-type': 'application/json'})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=600) as r:
        j = json.loads(r.read())
    return time.perf_counter() - t0, [d['embedding'] for d in sorted(j['data'], key=lambda d: d['index'])]


ours, ours_url = start([a.binary, 'serve', '-m', a.model, '-t', str(a.threads), '-c', str(CTX), '--port', '0',
                        '--pooling', a.pooling],
                       lambda l: (m := re.search(r'listening on (http://[0-9.:]+)', l)) and m.group(1))
port = 18000 + os.getpid() % 1000
# (embeddings need the whole input in one ubatch: -ub at least the input, else its default 512;
# --ref-slots: its parallel slots)
ub = 512 if a.tokens * 1.5 < 512 else CTX
ref, _ = start([REF, '-m', a.model, '-t', str(a.threads), '-c', str(CTX), '-np', str(a.ref_slots), '-b', str(max(ub, 2048)),
                '-ub', str(ub),
                '--embeddings', '--pooling', a.pooling, '--port', str(port)],
               lambda l: 'server is listening' in l or 'HTTP server listening' in l)
ref_url = f'http://127.0.0.1:{port}'
for _ in range(600):  # (it listens before its model is loaded: /health says 503 until then)
    try:
        with urllib.request.urlopen(ref_url + '/health', timeout=5) as r:
            if r.status == 200:
                break
    except OSError:
        time.sleep(0.5)
try:
    words = 'the quick brown fox jumps over a lazy dog while seven wizards quietly judge boxing matches'.split()
    def texts(r):  # fresh texts each round, from their first words (no prefix-cache hits)
        return [f'Round {r} input {i}: ' + ' '.join(words[(i * 7 + r * 3 + k) % len(words)] for k in range(int(a.tokens * 0.8)))
                for i in range(a.inputs)]
    _, mine = post(ours_url, {'input': texts(-1)})
    _, theirs = post(ref_url, {'input': texts(-1)})
    cos = [sum(x * y for x, y in zip(u, v)) for u, v in zip(mine, theirs)]
    print(f'{a.model}, pooling {a.pooling}: cosine(ours, llama.cpp) over {len(cos)} inputs: '
          f'min {min(cos):.6f}, mean {st.mean(cos):.6f}')
    t_ours, t_ref = [], []
    for r in range(a.rounds):
        for url, out in ([(ours_url, t_ours), (ref_url, t_ref)] if r % 2 == 0 else [(ref_url, t_ref), (ours_url, t_ours)]):
            out.append(post(url, {'input': texts(r)})[0] * 1000)
    print(f'{a.inputs} inputs x ~{a.tokens} tokens, {a.rounds} rounds alternated: ours {st.median(t_ours):.0f} ms '
          f'({", ".join(f"{x:.0f}" for x in t_ours)}), llama.cpp {st.median(t_ref):.0f} ms '
          f'({", ".join(f"{x:.0f}" for x in t_ref)}): ratio {st.median(t_ours) / st.median(t_ref):.2f}')
finally:
    for p in (ours, ref):
        p.terminate()
        p.wait()
