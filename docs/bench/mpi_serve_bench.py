#!/usr/bin/env python3
"""TTFT and decode tokens/s of `serve` in one process and under mpirun (TP, PP, both), back to back.

  docs/bench/mpi_serve_bench.py [--rounds N] [--streams S] [--no-long] [1t 2t tp2 pp2 pp2s1 tp2pp2 base:pp2 ...]
  (env EXE, BASE_EXE, MODEL; default configs: 1t tp2 pp2; "base:X" runs X with BASE_EXE; pp2s1:
  pp2 with FT_PP_STEPS_IN_FLIGHT=1, its decode steps not overlapped)

Per configuration and round (the configurations alternate within each round): a ~2.2k-token
prompt alone (not with --no-long), streamed with 64 greedy tokens (TTFT, its decode tokens/s), then S streams at once
(short distinct prompts, 64 tokens each: their aggregate decode tokens/s, first token to last);
rank 0's communication from its log and from `firsttoken profile` of its trace (--profile). Run it
under the CPU lock; only ratios from one run mean anything on a shared VM.
"""
import http.client, json, os, re, signal, subprocess, sys, threading, time
EXE = os.environ.get("EXE", "build/firsttoken")
BASE_EXE = os.environ.get("BASE_EXE", EXE)
MODEL = os.environ.get("MODEL", "/tmp/m/tinyllama-q4_0.gguf")
MPI = ["mpirun", "--oversubscribe", "--allow-run-as-root"]
text = " ".join(f"The {w} walked to the {v} and saw {n} birds." for w, v, n in
                [("boy", "park", 3), ("girl", "river", 5), ("dog", "house", 7), ("cat", "garden", 2)] * 12)

def start(cmd):
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    lines = []
    t_end = time.time() + 300
    while time.time() < t_end:
        l = p.stderr.readline()
        if not l: break
        lines.append(l)
        m = re.search(r"listening on http://[^:]+:(\d+)", l)
        if m:
            threading.Thread(target=lambda: [lines.append(x) for x in p.stderr], daemon=True).start()
            return p, int(m.group(1)), lines
    os.killpg(p.pid, signal.SIGKILL); raise RuntimeError("".join(lines))

def stream(port, prompt, n=64, out=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    body = {"model": "m", "prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    t0 = time.time(); c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse(); t_first = None; t_last = None; usage = None
    for line in r:
        if not line.startswith(b"data:") or line.strip() == b"data: [DONE]": continue
        d = json.loads(line[5:])
        if d.get("usage"): usage = d["usage"]
        if d.get("choices"):
            t_last = time.time()
            if t_first is None: t_first = t_last
    toks = usage["completion_tokens"]  # (a chunk may carry several tokens, or none: UTF-8 held back)
    res = ((t_first - t0) * 1e3, (toks - 1) / max(t_last - t_first, 1e-9), usage, t_first, t_last, toks)
    if out is not None: out.append(res)
    return res

def rank0_pid(pid):
    for d in os.listdir("/proc"):
        if not d.isdigit(): continue
        try:
            st = open(f"/proc/{d}/stat").read()
            if int(st.rsplit(")", 1)[1].split()[1]) != pid: continue
            if b"OMPI_COMM_WORLD_RANK=0\0" in open(f"/proc/{d}/environ", "rb").read(): return int(d)
        except OSError: pass
    return pid

def run(name, cmd, prof, streams):
    p, port, lines = start(cmd + ["--profile", prof])
    try:
        ttft, dec, usage = stream(port, text)[:3] if long_prompt else (0, 0, None)
        outs = []
        ts = [threading.Thread(target=stream, args=(port, f"Story {i}: once upon a time a {w} lived near the sea.", 64, outs))
              for i, w in enumerate(["fox", "king", "robot", "whale", "baker", "ghost", "pilot", "snail"][:streams])]
        for t in ts: t.start()
        for t in ts: t.join()
        t_a = min(o[3] for o in outs); t_b = max(o[4] for o in outs)
        agg = sum(o[5] - 1 for o in outs) / (t_b - t_a)
    finally:
        os.kill(rank0_pid(p.pid) if cmd[0] == "mpirun" else p.pid, signal.SIGTERM)
        try: p.wait(60)
        except subprocess.TimeoutExpired: os.killpg(p.pid, signal.SIGKILL); p.wait()
    time.sleep(0.5)
    comm = [l.strip() for l in lines if "communication per step" in l]
    ptxt = subprocess.run([cmd[cmd.index("serve") - 1], "profile", prof], capture_output=True, text=True).stdout
    pcomm = [l.strip() for l in ptxt.splitlines() if "communication (" in l]
    print(f"{name}: prompt {usage['prompt_tokens'] if usage else '?'} tokens: TTFT {ttft:.0f} ms, decode {dec:.1f} tok/s; "
          f"{streams} streams: {agg:.1f} tok/s", flush=True)
    for l in comm + pcomm: print("   ", l[-200:], flush=True)
    return ttft, agg

def cfg(w):
    exe = BASE_EXE if w.startswith("base:") else EXE
    w = w.removeprefix("base:")
    serve = [exe, "serve", "-m", MODEL, "--served-model-name", "m", "--port", "0", "-c", "4096", "-t", "1"]
    return {"1t": serve, "2t": serve[:-1] + ["2"], "tp2": MPI + ["-n", "2"] + serve + ["--tp", "2"],
            "pp2": MPI + ["-n", "2"] + serve + ["--pp", "2"],
            "pp2s1": MPI + ["-n", "2", "-x", "FT_PP_STEPS_IN_FLIGHT=1"] + serve + ["--pp", "2"],
            "tp2pp2": MPI + ["-n", "4"] + serve + ["--tp", "2", "--pp", "2"]}[w]

args = sys.argv[1:]
rounds, streams, long_prompt = 1, 4, True
while args and args[0].startswith("--"):
    if args[0] == "--no-long":
        long_prompt = False
        args = args[1:]
        continue
    if args[0] == "--rounds": rounds = int(args[1])
    elif args[0] == "--streams": streams = int(args[1])
    else: sys.exit(f"unknown option {args[0]}")
    args = args[2:]
which = args or ["1t", "tp2", "pp2"]
res = {w: [] for w in which}
for r in range(rounds):
    print(f"-- round {r + 1}", flush=True)
    for w in which: res[w].append(run(w, cfg(w), f"/tmp/mpi-serve-bench-{w.replace(':', '-')}.json", streams))
print("-- summary (per round: TTFT ms / aggregate decode tok/s)")
for w in which: print(f"{w}: " + "; ".join(f"{a:.0f} / {b:.1f}" for a, b in res[w]))
