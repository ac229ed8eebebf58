#!/usr/bin/env python3
"""Greedy continuations of one GGUF file through our server and the reference engine's.

A development check for files the reference can read and no golden covers (a new weight type, an
architecture the goldens predate): random token-id prompts through both servers' /completion;
per prompt, the top-10 log-probabilities of the first generated token (ids in common, and the
largest difference of a common id's log-probability) and how many greedy tokens agree. Random
weights give near-flat distributions (top-2 margins of ~0.05 nats), so greedy continuations part
at near-ties even for Q8_0: compare the log-probabilities with those of the same model in a
type both engines compute alike. Not a ctest: it needs ../shared/reference.

  tests/oracle/greedy_vs_reference.py FILE.gguf [--prompts 6] [--tokens 24] [--seed 1]
  (--reference-model OTHER.gguf: the reference reads OTHER, e.g. the unquantized weights, for the
  scale of a quantization's own effect)
"""
import argparse
import json
import os
import random
import socket
import subprocess
import sys
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REF = os.path.join(ROOT, "..", "shared", "reference")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port, path, body, timeout=600):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def wait_ready(port, proc, what):
    for _ in range(600):
        if proc.poll() is not None:
            sys.exit(f"{what} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except Exception:
            pass
        time.sleep(0.5)
    sys.exit(f"{what} did not become ready")


def continuations(cmd, env, port, prompts, n, what):
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(port, proc, what)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=10) as r:
            model = json.loads(r.read())["data"][0]["id"]
        out = []
        for p in prompts:
            r = post(port, "/completion", {"model": model, "prompt": p, "n_predict": n, "temperature": 0,
                                          "top_k": 1, "cache_prompt": False, "n_probs": 10})
            first = r["completion_probabilities"][0]["top_logprobs"]
            out.append((r["content"], {x["id"]: x["logprob"] for x in first}))
        return out
    finally:
        proc.terminate()
        proc.wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--reference-model", help="the file the reference reads (default: the same)")
    ap.add_argument("--vocab", type=int, default=32000, help="token ids are drawn from [3, vocab)")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    prompts = [[1] + [rng.randrange(3, a.vocab) for _ in range(rng.randrange(14, 38))] for _ in range(a.prompts)]
    ours_port, ref_port = free_port(), free_port()
    ours = continuations([os.path.join(ROOT, "build", "firsttoken"), "serve", "-m", a.model, "-t", "2",
                          "--port", str(ours_port)], dict(os.environ), ours_port, prompts, a.tokens, "firsttoken")
    env = dict(os.environ, LD_LIBRARY_PATH=REF)
    ref = continuations([os.path.join(REF, "llama-server"), "-m", a.reference_model or a.model, "-t", "2", "-c", "512", "-np", "1",
                         "--port", str(ref_port)], env, ref_port, prompts, a.tokens, "llama-server")
    same, worst = 0, 0.0
    for i, ((x, px), (y, py)) in enumerate(zip(ours, ref)):
        k = 0
        while k < min(len(x), len(y)) and x[k] == y[k]:
            k += 1
        common = px.keys() & py.keys()
        diff = max((abs(px[t] - py[t]) for t in common), default=float("inf"))
        worst = max(worst, diff)
        same += x == y
        print(f"prompt {i} ({len(prompts[i])} tokens): top-10 ids in common {len(common)}, top-1 "
              f"{'same' if max(px, key=px.get) == max(py, key=py.get) else 'differs'}, max |logprob diff| "
              f"{diff:.4f}; text {'identical' if x == y else f'agrees for {k} of {len(y)} characters'}")
    print(f"{same} of {len(prompts)} continuations identical; worst top-10 logprob difference {worst:.4f}")

if __name__ == "__main__":
    main()
