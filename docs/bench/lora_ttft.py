# Issue 17: a base request's TTFT alone, under 4 streams of 4 LoRA adapters, and under 4 streams of
# the base (the same load without adapters) twice (the second, a control: the spread between two
# measurements of one load), in alternated rounds of 6 requests each (ROUNDS, default 4).
# Usage (in a directory holding 110m.gguf and a1..a4.gguf, see the README's LoRA section):
#   python3 docs/bench/lora_ttft.py [FIRSTTOKEN_BINARY]
import json, os, subprocess, sys, threading, time, urllib.request, re, statistics as st
B = sys.argv[1] if len(sys.argv) > 1 else 'build/firsttoken'
srv = subprocess.Popen([B, 'serve', '-m', '110m.gguf', '--port', '0', '-t', '2', '--served-model-name', 'base']
                       + sum([['--lora', f'a{i}=a{i}.gguf'] for i in range(1, 5)], []), stderr=subprocess.PIPE, text=True)
url = None
log = ''
while url is None:
    line = srv.stderr.readline(); log += line
    m = re.search(r'listening on (http://[0-9.:]+)', line)
    if m: url = m.group(1)
threading.Thread(target=lambda: [None for _ in srv.stderr], daemon=True).start()

def stream(model, prompt, max_tokens):
    req = urllib.request.Request(url + '/v1/completions', data=json.dumps(
        {'model': model, 'prompt': prompt, 'max_tokens': max_tokens, 'ignore_eos': True, 'stream': True, 'temperature': 0}).encode(),
        headers={'content-type': 'application/json'})
    t0 = time.perf_counter(); ttft = None
    with urllib.request.urlopen(req) as r:
        for line in r:
            if ttft is None and line.startswith(b'data: {'):
                ttft = time.perf_counter() - t0
    return ttft

stop = threading.Event()
def traffic(i, model):
    while not stop.is_set():
        stream(model, f'Adapter {i} story number {time.time()} ' * 4, 32)

prompt = lambda k: f'Base request {k} about the weather and the sea ' * 6   # ~60 tokens, fresh each time
alone, busy, basebusy, control = [], [], [], []
def under(models, out, tag):
    stop.clear(); ts = [threading.Thread(target=traffic, args=(i, m)) for i, m in enumerate(models, 1)]
    [t.start() for t in ts]; time.sleep(0.5)
    for k in range(6): out.append(stream('base', prompt(tag + str(k)), 4) * 1000); time.sleep(0.05)
    stop.set(); [t.join() for t in ts]
for rnd in range(int(os.environ.get('ROUNDS', 4))):
    for k in range(6): alone.append(stream('base', prompt(f'{rnd}a{k}'), 4) * 1000); time.sleep(0.05)
    under(['a1', 'a2', 'a3', 'a4'], busy, f'{rnd}b')
    under(['base'] * 4, basebusy, f'{rnd}c')
    under(['base'] * 4, control, f'{rnd}d')
srv.terminate(); srv.wait()
f = lambda xs: f'p50 {st.median(xs):.1f} ms, mean {st.mean(xs):.1f}, max {max(xs):.1f} (n={len(xs)})'
print('base TTFT alone:              ', f(alone))
print('base TTFT under 4-adapter load:', f(busy))
print('base TTFT under 4 base streams:', f(basebusy))
print('  the same, again (control):   ', f(control))
r = lambda a, b: '%.2f; means: %.2f' % (st.median(a) / st.median(b), st.mean(a) / st.mean(b))
print('adapter traffic / base traffic, medians:', r(busy, basebusy))
print('control / base traffic (spread), medians:', r(control, basebusy))
