#!/usr/bin/env python3
"""TTFT and decode tokens/s of `serve` in one process and under mpirun (TP, PP, both), back to back.

  docs/bench/mpi_serve_bench.py [1t 2t tp2 pp2 tp2pp2]   (env EXE, MODEL; default all but 2t/tp2pp2)

Per configuration: a ~2.2k-token prompt then 64 greedy tokens, three times (the second and third
prefix-cached), streamed; rank 0's communication from its log and from `firsttoken profile` of its
trace (--profile). Run it under the CPU lock; only ratios from one run mean anything on a shared VM.
"""
import http.client, json, os, re, signal, subprocess, sys, threading, time
EXE = os.environ.get("EXE", "build/firsttoken")
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
    p.kill(); raise RuntimeError("".join(lines))

def stream(port, prompt, n=64):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    body = {"model": "m", "prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    t0 = time.time(); c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse(); t_first = None; toks = 0; usage = None
    for line in r:
        if not line.startswith(b"data:") or line.strip() == b"data: [DONE]": continue
        d = json.loads(line[5:])
        if d.get("usage"): usage = d["usage"]
        if d.get("choices") and d["choices"][0].get("text") is not None:
            toks += 1
            if t_first is None: t_first = time.time()
    t1 = time.time()
    return (t_first - t0) * 1e3, (toks - 1) / (t1 - t_first), usage

def run(name, cmd, prof):
    p, port, lines = start(cmd + ["--profile", prof])
    res = [stream(port, text) for _ in range(3)]
    r = [l for l in lines]
    pid = p.pid
    # SIGTERM to rank 0: under mpirun find it; else the process itself
    target = pid
    if cmd[0] == "mpirun":
        for d in os.listdir("/proc"):
            if not d.isdigit(): continue
            try:
                st = open(f"/proc/{d}/stat").read()
                if int(st.rsplit(")", 1)[1].split()[1]) != pid: continue
                env = open(f"/proc/{d}/environ", "rb").read()
                if b"OMPI_COMM_WORLD_RANK=0\0" in env: target = int(d)
            except OSError: pass
    os.kill(target, signal.SIGTERM); p.wait(60); time.sleep(0.5)
    comm = [l.strip() for l in lines if "communication per step" in l]
    ptxt = subprocess.run([EXE, "profile", prof], capture_output=True, text=True).stdout
    pcomm = [l.strip() for l in ptxt.splitlines() if "communication (" in l or l.startswith("steps:")]
    print(f"{name}: prompt {res[0][2]['prompt_tokens'] if res[0][2] else '?'} tokens; TTFT ms " +
          ", ".join(f"{x[0]:.0f}" for x in res) + "; decode tok/s " + ", ".join(f"{x[1]:.1f}" for x in res), flush=True)
    for l in comm + pcomm: print("   ", l[-260:], flush=True)

serve = [EXE, "serve", "-m", MODEL, "--served-model-name", "m", "--port", "0", "-c", "4096", "-t", "1"]
which = sys.argv[1:] or ["1t", "tp2", "pp2"]
cfgs = {"1t": serve, "2t": serve[:-1] + ["2"], "tp2": MPI + ["-n", "2"] + serve + ["--tp", "2"],
        "pp2": MPI + ["-n", "2"] + serve + ["--pp", "2"], "tp2pp2": MPI + ["-n", "4"] + serve + ["--tp", "2", "--pp", "2"]}
for w in which:
    run(w, cfgs[w], f"/tmp/mpi-serve-bench-{w}.json")
