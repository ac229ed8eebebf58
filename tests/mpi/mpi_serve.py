#!/usr/bin/env python3
"""`firsttoken serve --tp/--pp` under `mpirun --oversubscribe` on loopback (issue 18), stdlib only.

--suite tp (`serve --tp 2`, 2 ranks), each check against a fresh job:
  1. greedy completions (two prompts, concurrently) equal one process's;
  2. SIGTERM to rank 0 drains and stops every rank: mpirun exits 0 within seconds;
  3. a rank that dies (SIGKILL to rank 1) ends the others within seconds, and a request in
     flight gets an error or a dropped connection, never a hang;
  4. start-up errors are said by every rank, and every rank exits non-zero: a world size that is
     not tp_size, tp_size 1 under a multi-rank launch, heads that do not divide by tp.
--suite pp:
  1. greedy completions equal one process's under pipeline parallelism (`--pp 2`, 2 ranks) and
     TP 2 x PP 2 (4 ranks); SIGTERM to rank 0 stops every rank (exit 0);
  2. the seed's sample config (tp_size 2, optimize_for_latency, speculative decoding on (n-gram),
     max_active_adapters 4) starts under `mpirun -n 2` and completes requests: the same greedy text;
  3. start-up errors on every rank: tp x pp other than the world size, more stages than layers.
--suite ppfail (`--pp 2`, a long prompt in chunks of 16, so rank 0 posts steps ahead of stage 1):
  1. stage 1 stopped (SIGSTOP) mid-pipeline: rank 0's wait for its oldest post hits the deadline
     (FT_MPI_TIMEOUT_S=3), it says which, and the job ends non-zero; the request gets an error;
  2. stage 1 killed (SIGKILL) mid-pipeline: the job ends non-zero within seconds.
Exit 0 when all hold; 77 (skipped) without mpirun or the shared model.
"""
import argparse
import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

MPIRUN = ["mpirun", "--oversubscribe", "--allow-run-as-root"]
failures = []


def check(cond, what):
    print(("ok    " if cond else "FAIL  ") + what, flush=True)
    if not cond:
        failures.append(what)


def start(cmd):
    """Starts cmd; returns (proc, port, lines) once the server listens (lines: its stderr so far)."""
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    lines = []
    port = None
    t_end = time.time() + 120
    while time.time() < t_end:
        line = p.stderr.readline()
        if not line:
            break
        lines.append(line)
        m = re.search(r"listening on http://[^:]+:(\d+)", line)
        if m:
            port = int(m.group(1))
            break
    if port is None:
        p.kill()
        raise RuntimeError("server did not start:\n" + "".join(lines))
    # keep draining stderr so the server never blocks on it
    threading.Thread(target=lambda: [lines.append(l) for l in p.stderr], daemon=True).start()
    return p, port, lines


def complete(port, prompt, max_tokens=24, timeout=120):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    body = {"model": "m", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {data[:300]!r}")
    return json.loads(data)["choices"][0]["text"]


def ranks(mpirun_pid):
    """{rank: pid} of the job's firsttoken processes (children of mpirun)."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid != mpirun_pid:
                continue
            with open(f"/proc/{d}/environ", "rb") as f:
                env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
            if b"OMPI_COMM_WORLD_RANK" in env:
                out[int(env[b"OMPI_COMM_WORLD_RANK"])] = int(d)
        except (OSError, ValueError, IndexError):
            pass
    return out


def wait_exit(p, seconds):
    try:
        return p.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        return None


def ranks_gone(pids, seconds=5.0):
    """Whether every pid has exited (or is a zombie) within seconds of the job's end: mpirun may
    exit while the ranks it signalled are still being torn down (a stopped one takes its SIGKILL
    late on a loaded machine). Any still there after that are killed, so that none outlives the test."""
    def gone(pid):
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] == "Z"
        except OSError:
            return True
    deadline = time.time() + seconds
    while not all(gone(pid) for pid in pids) and time.time() < deadline:
        time.sleep(0.1)
    left = [pid for pid in pids if not gone(pid)]
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return not left


def concurrent(port, prompts):
    got = [None] * len(prompts)

    def ask(i):
        got[i] = complete(port, prompts[i])

    ts = [threading.Thread(target=ask, args=(i,)) for i in range(len(prompts))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return got


def startup_error(serve, n, extra, needle):
    """mpirun -n N serve EXTRA must fail on every rank, each saying needle."""
    q = subprocess.run(MPIRUN + ["-n", str(n)] + serve + extra, capture_output=True, text=True, timeout=120)
    said = q.stderr.count(needle)
    check(q.returncode != 0 and said == n,
          f"mpirun -n {n} serve {' '.join(extra)}: rc {q.returncode}, '{needle}' said by {said} of {n} ranks"
          + ("" if said == n else "\n" + q.stderr[-1500:]))


def stop_job(p, what):
    r = ranks(p.pid)
    t0 = time.time()
    os.kill(r[0], signal.SIGTERM)
    rc = wait_exit(p, 30)
    check(rc == 0, f"{what}: SIGTERM on rank 0: mpirun exits 0 (rc {rc}, {time.time() - t0:.1f} s)")


def metric(port, name):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", "/metrics")
    for line in c.getresponse().read().decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def suite_pp(serve, prompts, want, model, tmp, spec_prompt, spec_want):
    # 1. Pipeline parallel, and both.
    for n, extra in ((2, ["--pp", "2"]), (4, ["--tp", "2", "--pp", "2"])):
        p, port, lines = start(MPIRUN + ["-n", str(n)] + serve + extra)
        got = concurrent(port, prompts)
        check(got == want, f"{' '.join(extra)}: greedy completions equal one process's" + ("" if got == want else f" got {got!r}"))
        tp, pp = (2, 2) if n == 4 else (1, 2)
        check(any(f"parallelism: rank 0 of {n} (MPI): tp {tp} x pp {pp}" in l for l in lines), f"{' '.join(extra)}: rank 0 logs the group")
        stop_job(p, " ".join(extra))
    # 2. The seed's sample config (README's, with tp_size 2 and speculative decoding on).
    cfg = {"scheduler": {"prefill_chunk_size": "auto", "step_latency_target_ms": 50, "max_num_seqs": 64,
                         "max_batch_tokens": 2048, "ttft_slo_base_ms": 100, "ttft_slo_stretch": 2,
                         "reject_late_factor": 0, "max_active_adapters": 4, "enable_speculative_decoding": True},
           "parallel_config": {"tp_size": 2, "pp_size": 1, "optimize_for_latency": True},
           "server": {"host": "127.0.0.1", "port": 0, "max_queue": 256, "threads": 1, "http_threads": 2,
                      "log_level": "info", "model": model, "served_model_name": "m", "context_length": 0},
           "kv_cache": {"memory_mib": 0, "block_size": 16, "prefix_caching": True, "dtype": "f16"}}
    path = os.path.join(tmp, "sample-config.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    p, port, lines = start(MPIRUN + ["-n", "2", serve[0], "serve", "--config", path])
    got = concurrent(port, prompts)
    check(got == want, "the sample config (tp 2, speculative decoding, 4 adapters) under mpirun -n 2: greedy "
          "completions equal one process's" + ("" if got == want else f" got {got!r}"))
    check(any("speculative decoding: ngram" in l for l in lines), "... with n-gram speculative decoding on")
    got = complete(port, spec_prompt, max_tokens=48)
    drafted = metric(port, "firsttoken:spec_decode_num_draft_tokens_total")
    check(got == spec_want and drafted and drafted > 0,
          f"... a repetitive prompt: drafts verified under TP ({drafted} draft tokens), the text equals one process's"
          + ("" if got == spec_want else f" got {got!r}, want {spec_want!r}"))
    stop_job(p, "sample config")
    # 3. Start-up errors.
    startup_error(serve, 2, ["--pp", "3"], "tp_size x pp_size = 1 x 3 = 3 but the job has 2 MPI ranks")
    startup_error(serve, 5, ["--pp", "5"], "at least one layer per stage")


def suite_ppfail(serve, tmp):
    path = os.path.join(tmp, "chunks.json")
    with open(path, "w") as f:
        json.dump({"scheduler": {"prefill_chunk_size": 16}}, f)
    long_prompt = "the cat sat on the mat and the dog ran in the park " * 30  # ~360 tokens: ~23 chunks
    timeout_s = 3
    for case in ("stopped", "killed"):
        os.environ["FT_MPI_TIMEOUT_S"] = str(timeout_s)
        p, port, lines = start(MPIRUN + ["-n", "2"] + serve + ["--pp", "2", "--config", path])
        r = ranks(p.pid)
        os.kill(r[1], signal.SIGSTOP)  # stage 1 takes nothing: rank 0 runs ahead until its posts wait
        result = {}

        def request():
            try:
                complete(port, long_prompt, max_tokens=4, timeout=60)
                result["error"] = None
            except Exception as e:  # noqa: BLE001: any error is the expected outcome
                result["error"] = repr(e)

        t = threading.Thread(target=request)
        t0 = time.time()
        t.start()
        if case == "killed":
            time.sleep(1)  # (< timeout_s: rank 0 is waiting on its posts, none timed out yet)
            os.kill(r[1], signal.SIGKILL)
            t0 = time.time()
        rc = wait_exit(p, 30)
        dt = time.time() - t0
        t.join(60)
        limit = timeout_s + 5 if case == "stopped" else 10
        check(rc is not None and rc != 0 and dt < limit,
              f"stage 1 {case} mid-pipeline: the job ends, non-zero (rc {rc}, {dt:.1f} s, limit {limit} s)")
        if case == "stopped":
            said = [l.strip() for l in lines if "not taken within" in l]
            check(bool(said), "rank 0 names the post that was not taken: " + (said[0][-160:] if said else "".join(lines[-5:])))
        check(not t.is_alive() and result.get("error"), f"the request in flight fails, no hang ({result.get('error')})")
        check(ranks_gone(r.values()), "no rank left running")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--exe", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--suite", choices=["tp", "pp", "ppfail"], default="tp")
    a = ap.parse_args()
    if not shutil.which("mpirun"):
        print("mpirun absent: skipped")
        return 77
    if not os.path.exists(a.model):
        print(f"shared model absent ({a.model}): skipped")
        return 77
    env_note = os.environ.setdefault("FT_MPI_TIMEOUT_S", "10")
    serve = [a.exe, "serve", "-m", a.model, "--served-model-name", "m", "--port", "0", "-t", "1", "--log-level", "info"]
    prompts = ["Once upon a time", "The little dog"]

    if a.suite == "ppfail":
        with tempfile.TemporaryDirectory() as tmp:
            suite_ppfail(serve, tmp)
        return 1 if failures else 0
    # 1. One process, then TP = 2: the same greedy text.
    p, port, _ = start(serve)
    want = [complete(port, x) for x in prompts]
    # (pp suite: a repetitive prompt, so that the n-gram drafter finds matches to propose)
    spec_prompt = "the cat sat on the mat and " * 8
    spec_want = complete(port, spec_prompt, max_tokens=48) if a.suite == "pp" else None
    p.send_signal(signal.SIGTERM)
    wait_exit(p, 30)
    if a.suite == "pp":
        with tempfile.TemporaryDirectory() as tmp:
            suite_pp(serve, prompts, want, a.model, tmp, spec_prompt, spec_want)
        print(f"(FT_MPI_TIMEOUT_S={env_note})")
        return 1 if failures else 0
    p, port, lines = start(MPIRUN + ["-n", "2"] + serve + ["--tp", "2"])
    got = concurrent(port, prompts)
    check(got == want, f"TP=2 greedy completions equal one process's ({want!r})" + ("" if got == want else f" got {got!r}"))
    check(any("parallelism: rank 0 of 2 (MPI): tp 2 x pp 1" in l for l in lines), "rank 0 logs the group")

    # 2. SIGTERM to rank 0: every rank stops, mpirun exits 0.
    r = ranks(p.pid)
    check(sorted(r) == [0, 1], f"two ranks under mpirun ({r})")
    t0 = time.time()
    os.kill(r[0], signal.SIGTERM)
    rc = wait_exit(p, 30)
    check(rc == 0, f"SIGTERM on rank 0: mpirun exits 0 (rc {rc}, {time.time() - t0:.1f} s)")

    # 3. Rank 1 dies (SIGKILL) with a request in flight: the job ends within seconds.
    p, port, lines = start(MPIRUN + ["-n", "2"] + serve + ["--tp", "2"])
    r = ranks(p.pid)
    result = {}

    killed = threading.Event()

    def inflight():
        # A stream: rank 1 is killed once its first token has arrived.
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            body = {"model": "m", "prompt": prompts[0], "max_tokens": 1500, "temperature": 0, "ignore_eos": True,
                    "stream": True}
            c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
            resp = c.getresponse()
            for line in resp:
                if line.startswith(b"data:") and not killed.is_set():
                    os.kill(r[1], signal.SIGKILL)
                    result["t0"] = time.time()
                    killed.set()
                if line.strip() == b"data: [DONE]":
                    result["done"] = True
            result["error"] = "the stream ended without [DONE]" if "done" not in result else None
        except Exception as e:  # noqa: BLE001: any error is the expected outcome
            result["error"] = repr(e)

    t = threading.Thread(target=inflight)
    t.start()
    killed.wait(60)
    rc = wait_exit(p, 30)
    dt = time.time() - result.get("t0", time.time())
    t.join(60)
    check(rc is not None and rc != 0 and dt < 15, f"rank 1 killed: the job ends, non-zero (rc {rc}, {dt:.1f} s)")
    check(not t.is_alive() and result.get("error"), f"the request in flight fails, no hang ({result.get('error')})")
    check(ranks_gone(r.values()), "no rank left running")

    # 4. Start-up errors: every rank says it, every rank exits non-zero.
    startup_error(serve, 2, ["--tp", "3"], "but the job has 2 MPI ranks")
    startup_error(serve, 2, [], "but tp_size x pp_size is 1")
    startup_error(serve, 3, ["--tp", "3"], "attention heads divisible by 3")
    print(f"(FT_MPI_TIMEOUT_S={env_note})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
