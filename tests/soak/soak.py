#!/usr/bin/env python3
"""Chaos/soak test of `firsttoken serve` over HTTP and the binary protocol (Python 3 stdlib only).

For --seconds, client threads send a mix of requests: streaming and non-streaming completions and
chats over HTTP, Anthropic messages, embeddings (some left by their client at once), streaming and non-streaming
requests over the binary port, requests cancelled
mid-stream (HTTP and binary), slow clients (a request written a few bytes at a time, a stream read
slowly), half-open clients (a header or frame that never completes, a request then a half-close).
Then an overload burst (more concurrent requests than --max-queue, more connections than
--max-connections), then streams in flight and SIGTERM.

Asserts: every request that was not abandoned by its client got a well-formed answer (200 with a
valid body or a complete SSE stream, a JSON error with 429/503 + Retry-After where the server is
full, a final binary frame) or, after SIGTERM, a well-formed refusal; KV blocks in use return to 0
(/metrics) once the load stops; RSS grows by at most --rss-growth-mib after warm-up; the server
exits 0 after SIGTERM. Prints a summary; exit status 0 when all hold.

Short form (CI, ctest `soak_short`): --seconds 20. Long form by hand: --seconds 600 (or
FT_SOAK_SECONDS=600 through ctest).
"""
import argparse
import collections
import http.client
import json
import os
import random
import re
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

# --- the binary protocol (proto/firsttoken.fbs): just enough FlatBuffers by hand ----------------
# Request fields by vtable slot: tokens 0, text 1, add_bos 2, sampling 3, max_tokens 4, stop 5,
# stream 6, ignore_eos 7, logprobs 8. Response: tokens 0, text 1, last 2, finish 3, prompt_tokens 4,
# completion_tokens 5, timings 6, error 7, logprobs 8.
FINISH = {0: "", 1: "stop", 2: "length", 3: "cancelled", 4: "error"}
HEADER_TIMEOUT_S = 2  # the server's header and body timeouts here: half-open clients are cut within the run


def encode_request(tokens, max_tokens, stream):
    """A framed Request {tokens, max_tokens, stream, ignore_eos: true}, laid out front to back:
    root offset | vtable | table (8-aligned) | tokens vector."""
    vtable = struct.pack("<11H", 22, 18, 4, 0, 0, 0, 8, 0, 16, 17, 0)
    head = struct.pack("<I", 32) + vtable
    head += b"\0" * (32 - len(head))
    # table at 32: soffset to the vtable (at 4), tokens offset (from 36 to the vector at 52),
    # max_tokens (40), stream (48), ignore_eos (49), padding to 52.
    table = struct.pack("<iIqBB", 32 - 4, 52 - 36, max_tokens, 1 if stream else 0, 1) + b"\0\0"
    vec = struct.pack("<I", len(tokens)) + struct.pack("<%di" % len(tokens), *tokens)
    body = head + table + vec
    return struct.pack("<I", len(body)) + body


def decode_response(buf):
    """The fields of a Response the soak checks: last, finish, error, text, number of tokens."""
    def u32(at):
        return struct.unpack_from("<I", buf, at)[0]

    table = u32(0)
    vt = table - struct.unpack_from("<i", buf, table)[0]
    vt_size = struct.unpack_from("<H", buf, vt)[0]

    def field(slot):
        at = 4 + 2 * slot
        return struct.unpack_from("<H", buf, vt + at)[0] if at < vt_size else 0

    def string(slot):
        off = field(slot)
        if not off:
            return ""
        at = table + off + u32(table + off)
        # (not checked as UTF-8: a byte-level vocabulary can sample bytes that never form UTF-8)
        return buf[at + 4:at + 4 + u32(at)].decode("utf-8", "replace")

    def vec_len(slot):
        off = field(slot)
        return u32(table + off + u32(table + off)) if off else 0

    last = field(2) and buf[table + field(2)] != 0
    finish = FINISH[buf[table + field(3)]] if field(3) else ""
    return {"last": bool(last), "finish": finish, "error": string(7), "text": string(1), "n_tokens": vec_len(0)}


def recv_exact(sock, n):
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise ConnectionError("closed after %d of %d bytes" % (len(out), n))
        out += chunk
    return out


def read_frame(sock):
    (n,) = struct.unpack("<I", recv_exact(sock, 4))
    return decode_response(recv_exact(sock, n))


class Failure(Exception):
    pass


# --- the server --------------------------------------------------------------------------------
class Server:
    def __init__(self, exe, args, log_path):
        self.log_path = log_path
        self.log = open(log_path, "w+b")
        self.proc = subprocess.Popen([exe, "serve", "--port", "0", "--binary-port-any"] + args,
                                     stdout=self.log, stderr=subprocess.STDOUT)
        self.port = self.bport = 0
        deadline = time.time() + 120
        while time.time() < deadline and not (self.port and self.bport):
            if self.proc.poll() is not None:
                raise Failure("server exited at start: " + self.tail())
            text = open(log_path, "rb").read().decode("utf-8", "replace")
            m = re.search(r"listening on http://[^:]+:(\d+)", text)
            b = re.search(r"binary protocol listening on [^:]+:(\d+)", text)
            self.port = int(m.group(1)) if m else 0
            self.bport = int(b.group(1)) if b else 0
            time.sleep(0.05)
        if not (self.port and self.bport):
            raise Failure("server did not start: " + self.tail())

    def tail(self, n=3000):
        try:
            return open(self.log_path, "rb").read()[-n:].decode("utf-8", "replace")
        except OSError:
            return ""

    def rss_mib(self):
        with open("/proc/%d/status" % self.proc.pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
        raise Failure("no VmRSS")

    def metrics(self):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            c.request("GET", "/metrics")
            r = c.getresponse()
            body = r.read().decode()
            if r.status != 200:
                raise Failure("/metrics: %d" % r.status)
        finally:
            c.close()
        out = {}
        for line in body.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                out[name] = float(value)
        return out


# --- the clients -------------------------------------------------------------------------------
MODEL = "tiny"


def check_error_body(status, headers, body, why):
    try:
        j = json.loads(body)
    except ValueError:
        raise Failure("%s: %d with a body that is not JSON: %r" % (why, status, body[:200]))
    if not isinstance(j, dict) or "error" not in j or "message" not in j["error"]:
        raise Failure("%s: %d without an OpenAI error object: %r" % (why, status, body[:200]))
    if status in (429,) and "retry-after" not in {k.lower() for k in headers}:
        raise Failure("%s: %d without Retry-After" % (why, status))


def completion_body(chat, stream, max_tokens):
    b = {"model": MODEL, "max_tokens": max_tokens, "stream": stream, "temperature": 0.8}
    if chat:
        b["messages"] = [{"role": "user", "content": "Tell me a story about %d cats." % random.randint(1, 99)}]
    else:
        b["prompt"] = "Once upon a time " * random.randint(1, 6)
    return json.dumps(b)


def http_request(port, chat, stream, max_tokens, draining=False, pause_s=0.0):
    """One completion; returns its outcome ("ok", "429", "503"). Raises Failure when malformed.
    pause_s: wait that long after the response head before reading on (the server's writes wait)."""
    path = "/v1/chat/completions" if chat else "/v1/completions"
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        try:
            c.request("POST", path, completion_body(chat, stream, max_tokens), {"Content-Type": "application/json"})
            r = c.getresponse()
        except (ConnectionError, http.client.RemoteDisconnected) as e:
            if draining:
                return "refused"
            raise Failure("%s: no answer: %s" % (path, e))
        if r.status in (429, 503):
            check_error_body(r.status, dict(r.getheaders()), r.read(), path)
            return str(r.status)
        if r.status != 200:
            raise Failure("%s: status %d: %r" % (path, r.status, r.read()[:300]))
        time.sleep(pause_s)
        if not stream:
            j = json.loads(r.read())
            ch = j["choices"][0]
            text = ch["message"]["content"] if chat else ch["text"]
            if not isinstance(text, str) or ch["finish_reason"] not in ("stop", "length"):
                raise Failure("%s: bad body %r" % (path, j))
            if j["usage"]["completion_tokens"] > max_tokens:
                raise Failure("%s: %d tokens > max_tokens %d" % (path, j["usage"]["completion_tokens"], max_tokens))
            return "ok"
        return read_sse(r, path)
    finally:
        c.close()


def read_sse(r, path):
    """Reads a stream to its [DONE]: every event JSON, a finish_reason before [DONE] (or an error
    event: a request cancelled at shutdown)."""
    finish = None
    while True:
        line = r.readline()
        if not line:
            raise Failure("%s: stream ended without [DONE]" % path)
        line = line.strip()
        if not line:
            continue
        if not line.startswith(b"data: "):
            raise Failure("%s: not an SSE data line: %r" % (path, line[:200]))
        data = line[6:]
        if data == b"[DONE]":
            if finish is None:
                raise Failure("%s: [DONE] without a finish_reason or an error" % path)
            r.read()
            return "ok" if finish != "error" else "stream_error"
        j = json.loads(data)
        if "error" in j:
            finish = "error"
            continue
        for ch in j.get("choices", []):
            if ch.get("finish_reason"):
                finish = ch["finish_reason"]


def binary_request(bport, stream, max_tokens, cancel=False):
    s = socket.create_connection(("127.0.0.1", bport), timeout=60)
    try:
        tokens = [1] + [random.randint(3, 255) for _ in range(random.randint(1, 12))]  # the tiny model: 260 ids
        s.sendall(encode_request(tokens, max_tokens, stream))
        n = 0
        while True:
            f = read_frame(s)
            n += f["n_tokens"]
            if cancel and n >= 1:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # RST
                return "cancelled"
            if f["last"]:
                if f["error"]:
                    if "retry later" in f["error"]:  # the queue is full (429 on HTTP)
                        return "busy"
                    raise Failure("binary: error frame: %s" % f["error"])
                if f["finish"] not in ("stop", "length") or n > max_tokens:
                    raise Failure("binary: bad final frame %r after %d tokens" % (f, n))
                return "ok"
            if not stream:
                raise Failure("binary: a non-streamed request got a frame before its last")
    finally:
        s.close()


def raw_post(path, body, close=False):
    """The bytes of a POST with a JSON body."""
    return (b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\n\r\n"
            % (path.encode(), b"Connection: close\r\n" if close else b"", len(body)) + body)


def read_to_eof(s, pause=0.0, chunk=4096):
    out = b""
    while True:
        if pause:
            time.sleep(pause)
        got = s.recv(chunk)
        if not got:
            return out
        out += got


def http_cancel(port):
    """A stream the client leaves after its first event (reset, not closed politely)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=60)
    try:
        s.sendall(raw_post("/v1/chat/completions", completion_body(True, True, 64).encode()))
        got = b""
        while b"data: " not in got:
            chunk = s.recv(4096)
            if not chunk:
                raise Failure("cancel: closed before the first event: %r" % got[:300])
            got += chunk
            if got.startswith(b"HTTP/1.1 429") or got.startswith(b"HTTP/1.1 503"):
                return "busy"
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        return "cancelled"
    finally:
        s.close()


def http_embeddings(port, leave=False):
    """/v1/embeddings of 1-8 inputs (text or token ids): one unit vector per input, in order. leave:
    the client resets the connection once the request is sent (its inputs are cancelled)."""
    n = random.randint(1, 8)
    inputs = [("Once upon a time %d " % random.randint(0, 999)) * random.randint(1, 4) for _ in range(n)]
    if random.random() < 0.3:
        inputs = [[random.randint(3, 250) for _ in range(random.randint(1, 40))] for _ in range(n)]  # (the tiny model: 260 ids)
    body = json.dumps({"model": MODEL, "input": inputs, "encoding_format": "float"})
    if leave:
        s = socket.create_connection(("127.0.0.1", port), timeout=60)
        try:
            s.sendall(raw_post("/v1/embeddings", body.encode()))
            time.sleep(random.random() * 0.05)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            return "left"
        finally:
            s.close()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        c.request("POST", "/v1/embeddings", body, {"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status in (429, 503):
            check_error_body(r.status, dict(r.getheaders()), r.read(), "/v1/embeddings")
            return str(r.status)
        if r.status != 200:
            raise Failure("/v1/embeddings: status %d: %r" % (r.status, r.read()[:300]))
        j = json.loads(r.read())
        if [d["index"] for d in j["data"]] != list(range(n)):
            raise Failure("/v1/embeddings: %d inputs, data %r" % (n, [d.get("index") for d in j["data"]]))
        dims = {len(d["embedding"]) for d in j["data"]}
        for d in j["data"]:
            norm = sum(x * x for x in d["embedding"]) ** 0.5
            if len(dims) != 1 or abs(norm - 1) > 1e-4:
                raise Failure("/v1/embeddings: dimensions %r, norm %f" % (dims, norm))
        return "ok"
    finally:
        c.close()


def http_messages(port, stream):
    """Anthropic's /v1/messages: a message (text blocks, a stop_reason, usage within max_tokens), or
    its events in order to message_stop (or an error event: cancelled at shutdown); 429/503 in
    Anthropic's error shape with Retry-After."""
    max_tokens = random.randint(1, 24)
    body = json.dumps({"model": MODEL, "max_tokens": max_tokens, "stream": stream, "system": "Be brief.",
                       "messages": [{"role": "user", "content": "Tell me about %d dogs." % random.randint(1, 99)}]})
    path = "/v1/messages"
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        c.request("POST", path, body, {"Content-Type": "application/json", "anthropic-version": "2023-06-01"})
        r = c.getresponse()
        if r.status in (429, 503):
            raw = r.read()
            j = json.loads(raw)
            if j.get("type") != "error" or "message" not in j.get("error", {}):
                raise Failure("%s: %d without an Anthropic error object: %r" % (path, r.status, raw[:200]))
            if r.status == 429 and "retry-after" not in {k.lower() for k in dict(r.getheaders())}:
                raise Failure("%s: 429 without Retry-After" % path)
            return str(r.status)
        if r.status != 200:
            raise Failure("%s: status %d: %r" % (path, r.status, r.read()[:300]))
        if not stream:
            j = json.loads(r.read())
            if j.get("type") != "message" or j.get("stop_reason") not in ("end_turn", "max_tokens") or \
                    any(b.get("type") != "text" for b in j["content"]) or j["usage"]["output_tokens"] > max_tokens:
                raise Failure("%s: bad message %r" % (path, j))
            return "ok"
        events, event = [], None
        while True:
            line = r.readline()
            if not line:
                raise Failure("%s: stream ended after %r without message_stop" % (path, events[-3:]))
            line = line.strip()
            if line.startswith(b"event: "):
                event = line[7:].decode()
            elif line.startswith(b"data: "):
                j = json.loads(line[6:])
                if j.get("type") != event:
                    raise Failure("%s: event %r carries type %r" % (path, event, j.get("type")))
                events.append(event)
                if event == "error":
                    r.read()
                    return "stream_error"
                if event == "message_stop":
                    r.read()
                    if events[0] != "message_start" or events[-2] != "message_delta":
                        raise Failure("%s: events out of order: %r" % (path, events))
                    return "ok"
            elif line:
                raise Failure("%s: not an SSE line: %r" % (path, line[:200]))
    finally:
        c.close()


def slow_writer(port):
    """A non-streamed request written a few bytes at a time (well within the header timeout)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=60)
    try:
        req = raw_post("/v1/completions", completion_body(False, False, 8).encode(), close=True)
        for i in range(0, len(req), 16):
            s.sendall(req[i:i + 16])
            time.sleep(0.01)
        resp = read_to_eof(s)
        status = resp.split(b" ", 2)[1] if resp.startswith(b"HTTP/1.1 ") else b""
        if status == b"200":
            json.loads(resp.split(b"\r\n\r\n", 1)[1])
            return "ok"
        if status in (b"429", b"503"):
            return "busy"
        raise Failure("slow writer: %r" % resp[:300])
    finally:
        s.close()


def slow_reader(port):
    """A stream read slowly through a small receive buffer: it must not hold up anyone else."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.settimeout(60)
    s.connect(("127.0.0.1", port))
    try:
        s.sendall(raw_post("/v1/completions", completion_body(False, True, 48).encode(), close=True))
        resp = read_to_eof(s, pause=0.02, chunk=256)
        if resp.startswith(b"HTTP/1.1 429") or resp.startswith(b"HTTP/1.1 503"):
            return "busy"
        if not resp.startswith(b"HTTP/1.1 200") or b"data: [DONE]" not in resp:
            raise Failure("slow reader: %r" % resp[-300:])
        return "ok"
    finally:
        s.close()


def half_open(port, bport):
    """Clients that stop halfway: an HTTP header never finished, a binary frame never finished, a
    request followed at once by a half-close (the server may answer or cancel; it must not hang)."""
    kind = random.randint(0, 2)
    if kind == 0:
        s = socket.create_connection(("127.0.0.1", port), timeout=30)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le")
    elif kind == 1:
        s = socket.create_connection(("127.0.0.1", bport), timeout=30)
        frame = encode_request([1, 2, 3], 4, True)
        s.sendall(frame[:random.randint(1, len(frame) - 1)])
    else:
        s = socket.create_connection(("127.0.0.1", port), timeout=30)
        s.sendall(raw_post("/v1/completions", completion_body(False, True, 16).encode()))
        s.shutdown(socket.SHUT_WR)
    return s  # held open by the caller until it is closed by the server or dropped


# --- the run -----------------------------------------------------------------------------------
class Tally:
    def __init__(self):
        self.lock = threading.Lock()
        self.counts = collections.Counter()
        self.failures = []

    def add(self, kind, outcome):
        with self.lock:
            self.counts[(kind, outcome)] += 1

    def fail(self, kind, msg):
        with self.lock:
            self.counts[(kind, "FAILED")] += 1
            if len(self.failures) < 20:
                self.failures.append("%s: %s" % (kind, msg))


def run_one(tally, kind, fn):
    try:
        tally.add(kind, fn())
    except Failure as e:
        tally.fail(kind, str(e))
    except (OSError, ValueError, KeyError, IndexError, struct.error) as e:
        tally.fail(kind, "%s: %s" % (type(e).__name__, e))


def mixed_load(srv, tally, seconds, n_threads):
    stop_at = time.time() + seconds
    held = []
    held_lock = threading.Lock()

    def worker(seed):
        rnd = random.Random(seed)
        while time.time() < stop_at:
            r = rnd.random()
            if r < 0.10:
                run_one(tally, "http_completion", lambda: http_request(srv.port, False, False, rnd.randint(1, 24)))
            elif r < 0.13:
                run_one(tally, "http_messages", lambda: http_messages(srv.port, rnd.random() < 0.5))
            elif r < 0.16:
                run_one(tally, "http_embeddings", lambda: http_embeddings(srv.port))
            elif r < 0.18:
                run_one(tally, "http_embeddings_left", lambda: http_embeddings(srv.port, leave=True))
            elif r < 0.36:
                run_one(tally, "http_chat_stream", lambda: http_request(srv.port, True, True, rnd.randint(1, 32)))
            elif r < 0.44:
                run_one(tally, "http_completion_stream", lambda: http_request(srv.port, False, True, 16))
            elif r < 0.58:
                run_one(tally, "binary_stream", lambda: binary_request(srv.bport, True, rnd.randint(1, 32)))
            elif r < 0.68:
                run_one(tally, "binary", lambda: binary_request(srv.bport, False, rnd.randint(1, 16)))
            elif r < 0.76:
                run_one(tally, "http_cancel", lambda: http_cancel(srv.port))
            elif r < 0.82:
                run_one(tally, "binary_cancel", lambda: binary_request(srv.bport, True, 64, cancel=True))
            elif r < 0.88:
                run_one(tally, "slow_writer", lambda: slow_writer(srv.port))
            elif r < 0.94:
                run_one(tally, "slow_reader", lambda: slow_reader(srv.port))
            else:
                try:
                    s = half_open(srv.port, srv.bport)
                    with held_lock:
                        held.append(s)
                        while len(held) > 16:  # the oldest goes away unannounced
                            held.pop(0).close()
                    tally.add("half_open", "held")
                except OSError as e:
                    tally.fail("half_open", str(e))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for s in held:
        s.close()


def overload_burst(srv, tally, n):
    """n requests at once (more than --max-queue): each one 200 or 429 + Retry-After; then more
    connections than --max-connections held open: the extra ones get 503 + Retry-After."""
    threads = [threading.Thread(target=run_one,
                                args=(tally, "burst", lambda: http_request(srv.port, False, False, 8)))
               for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


class HeldExpired(Exception):
    """The held connections may have reached the header timeout: the server rightly freed a slot."""


def connection_flood(srv, tally, max_connections, attempts=3):
    """max_connections idle connections held open, then 4 more: each 503 + Retry-After. The held
    ones send nothing, so the server closes them after HEADER_TIMEOUT_S; an answer that comes
    later than that (a loaded machine) proves nothing and the flood starts again."""
    for attempt in range(attempts):
        held = [socket.create_connection(("127.0.0.1", srv.port), timeout=10) for _ in range(max_connections)]
        t_held = time.time()
        time.sleep(0.3)  # all accepted
        try:
            for _ in range(4):
                def refused():
                    s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
                    try:
                        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
                        resp = read_to_eof(s)
                    finally:
                        s.close()
                    head, _, body = resp.partition(b"\r\n\r\n")
                    if not head.startswith(b"HTTP/1.1 503") or b"\r\nRetry-After: " not in head:
                        if time.time() - t_held > 0.75 * HEADER_TIMEOUT_S and attempt + 1 < attempts:
                            raise HeldExpired()
                        raise Failure("over --max-connections: %r" % resp[:300])
                    check_error_body(503, {}, body, "refused connection")
                    return "503"
                run_one(tally, "flood", refused)
            return
        except HeldExpired:
            print("soak: flood: the held connections neared the header timeout; again", flush=True)
        finally:
            for s in held:
                s.close()
        time.sleep(HEADER_TIMEOUT_S)  # the server sees the closes


def sigterm_under_load(srv, tally):
    """Streams in flight, then SIGTERM: each ends well-formed (finished, or an error event when the
    shutdown deadline cancels it); a request after it is refused; the server exits 0."""
    results = []

    def stream():
        try:
            results.append(http_request(srv.port, True, True, 1000, draining=True, pause_s=1.0))
        except Failure as e:
            results.append("FAILED " + str(e))

    threads = [threading.Thread(target=stream) for _ in range(4)]
    for t in threads:
        t.start()
    time.sleep(0.5)
    srv.proc.send_signal(signal.SIGTERM)
    time.sleep(0.2)
    run_one(tally, "after_sigterm", lambda: http_request(srv.port, False, False, 4, draining=True))
    for t in threads:
        t.join()
    for r in results:
        if r.startswith("FAILED"):
            tally.fail("sigterm_stream", r)
        else:
            tally.add("sigterm_stream", r)
    try:
        rc = srv.proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        srv.proc.kill()
        raise Failure("the server did not exit within 60 s of SIGTERM")
    if rc != 0:
        raise Failure("the server exited %d after SIGTERM" % rc)


def wait_kv_zero(srv, timeout_s=30):
    deadline = time.time() + timeout_s
    while True:
        m = srv.metrics()
        used = m.get("firsttoken:kv_cache_used_blocks", -1)
        running = m.get("firsttoken:num_requests_running", -1)
        if used == 0 and running == 0:
            return m
        if time.time() > deadline:
            raise Failure("KV blocks in use stay at %s (running %s) after the load stopped" % (used, running))
        time.sleep(0.2)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--exe", required=True, help="the firsttoken executable")
    ap.add_argument("--model", default="", help="GGUF model (default: the built-in synthetic one)")
    ap.add_argument("--seconds", type=float, default=float(os.environ.get("FT_SOAK_SECONDS", 20)))
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--max-queue", type=int, default=4)
    ap.add_argument("--max-connections", type=int, default=48)
    ap.add_argument("--rss-growth-mib", type=float, default=64)
    ap.add_argument("--seed", type=int, default=int(time.time()))
    a = ap.parse_args()
    random.seed(a.seed)
    global MODEL

    workdir = tempfile.mkdtemp(prefix="ft-soak-")
    cfg = os.path.join(workdir, "config.json")
    with open(cfg, "w") as f:  # short timeouts so that half-open clients are cut within the run
        json.dump({"server": {"header_timeout_s": HEADER_TIMEOUT_S, "body_timeout_s": HEADER_TIMEOUT_S, "write_timeout_s": 10}}, f)
    args = ["--config", cfg, "--threads", "1", "--http-threads", "2", "--max-queue", str(a.max_queue),
            "--max-connections", str(a.max_connections), "--frame-timeout", "2", "--shutdown-timeout", "5",
            "--served-model-name", MODEL]
    if a.model:
        args += ["--model", a.model]
    log = os.path.join(workdir, "server.log")
    print("soak: %.0f s, %d clients, seed %d, log %s" % (a.seconds, a.clients, a.seed, log), flush=True)
    tally = Tally()
    try:
        srv = Server(a.exe, args, log)
    except Failure as e:
        print("soak: FAILED: %s" % e)
        return 1
    try:
        t0 = time.time()
        warm = min(5.0, a.seconds / 4)
        mixed_load(srv, tally, warm, a.clients)
        wait_kv_zero(srv)
        rss0 = srv.rss_mib()
        mixed_load(srv, tally, a.seconds - warm, a.clients)
        overload_burst(srv, tally, 6 * a.max_queue)
        connection_flood(srv, tally, a.max_connections)
        time.sleep(2.5)  # half-open clients' timeouts fire
        m = wait_kv_zero(srv)
        rss1 = srv.rss_mib()
        open_http = m.get('firsttoken:connections_open{listener="http"}', -1)
        open_bin = m.get('firsttoken:connections_open{listener="binary"}', -1)
        print("soak: RSS %.1f MiB after warm-up, %.1f MiB at the end (+%.1f); open connections http %d binary %d; "
              "429s %d, refused %d" % (rss0, rss1, rss1 - rss0, open_http, open_bin,
                                       m.get("firsttoken:request_rejected_total", 0),
                                       m.get('firsttoken:connections_refused_total{listener="http"}', 0)), flush=True)
        if rss1 - rss0 > a.rss_growth_mib:
            tally.fail("rss", "grew %.1f MiB (limit %.0f)" % (rss1 - rss0, a.rss_growth_mib))
        if open_bin != 0 or open_http > 1:
            tally.fail("connections", "still open after the load: http %d, binary %d" % (open_http, open_bin))
        sigterm_under_load(srv, tally)
        print("soak: %.1f s in all" % (time.time() - t0))
    except Failure as e:
        tally.fail("run", str(e))
    finally:
        if srv.proc.poll() is None:
            srv.proc.kill()
            srv.proc.wait()

    for (kind, outcome), n in sorted(tally.counts.items()):
        print("  %-24s %-14s %6d" % (kind, outcome, n))
    done = sum(n for (k, o), n in tally.counts.items() if o == "ok")
    if tally.failures or done == 0:
        print("soak: FAILED (%d completed requests)" % done)
        for f in tally.failures:
            print("  " + f)
        print("--- server log (tail) ---\n" + srv.tail())
        return 1
    print("soak: OK (%d completed requests)" % done)
    return 0


if __name__ == "__main__":
    sys.exit(main())
