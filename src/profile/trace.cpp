#include "profile/trace.h"

#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <deque>
#include <memory>
#include <mutex>
#include <unordered_set>
#include <vector>

#include "core/error.h"

namespace ft::profile {

namespace detail {
std::atomic<bool> g_enabled{false};
}

namespace {

// ph: 'X' complete, 'A' async span (written as a "b"/"e" pair), 'C' counter.
struct Event {
  const char* name = nullptr;
  const char* cat = nullptr;
  char ph = 'X';
  uint8_t n_args = 0;
  int64_t ts = 0;
  int64_t dur = 0;
  uint64_t id = 0;
  Arg args[kMaxArgs];
  const char* raw_key = nullptr;
  std::string raw;
};

constexpr size_t kMaxChunks = kMaxEventsPerThread / kChunkEvents;

struct ThreadBuf {
  int tid = 0;
  std::string name;  // guarded by Registry::mu
  std::atomic<size_t> n{0};
  std::atomic<bool> alive{true};
  Event* chunks[kMaxChunks] = {};
  ~ThreadBuf() {
    for (Event* c : chunks) delete[] c;
  }
};

struct Registry {
  std::mutex mu;
  std::vector<std::shared_ptr<ThreadBuf>> bufs;
  int next_tid = 1;
  std::deque<std::string> strings;
  std::unordered_set<std::string_view> interned;
  std::vector<std::pair<std::string, std::string>> meta;  // key, JSON value
  std::string path;
  int64_t origin = -1;
  std::atomic<uint64_t> dropped{0};
};

// Leaked on purpose: threads may record while static destructors run.
Registry& reg() {
  static Registry* r = new Registry;
  return *r;
}

struct Holder {
  std::shared_ptr<ThreadBuf> buf;
  ~Holder() {
    if (buf) buf->alive.store(false);
  }
};
thread_local Holder t_holder;        // touched once per thread (registration)
thread_local ThreadBuf* t_buf = nullptr;  // the hot path reads only this

ThreadBuf* local() {
  if (t_buf) return t_buf;
  auto b = std::make_shared<ThreadBuf>();
  b->chunks[0] = new Event[kChunkEvents];
  {
    Registry& r = reg();
    std::lock_guard<std::mutex> lk(r.mu);
    b->tid = r.next_tid++;
    r.bufs.push_back(b);
  }
  t_holder.buf = b;
  t_buf = b.get();
  return t_buf;
}

// The next free slot of this thread's buffer, or null when it is full.
Event* slot(ThreadBuf* b) {
  const size_t i = b->n.load(std::memory_order_relaxed);
  if (i >= kMaxEventsPerThread) {
    reg().dropped.fetch_add(1, std::memory_order_relaxed);
    return nullptr;
  }
  Event*& c = b->chunks[i / kChunkEvents];
  if (!c) c = new Event[kChunkEvents];
  return &c[i % kChunkEvents];
}

void publish(ThreadBuf* b) { b->n.store(b->n.load(std::memory_order_relaxed) + 1, std::memory_order_release); }

void fill(Event& e, char ph, const char* name, const char* cat, int64_t ts, int64_t dur, uint64_t id,
          const Args& args) {
  e.ph = ph;
  e.name = name;
  e.cat = cat;
  e.ts = ts;
  e.dur = dur;
  e.id = id;
  e.n_args = uint8_t(args.size());
  for (int k = 0; k < args.size(); ++k) e.args[k] = args[k];
  e.raw_key = nullptr;
  e.raw.clear();
}

// --- JSON writing -----------------------------------------------------------------------------
void put_str(std::string& out, std::string_view s) {
  out += '"';
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += ch;
    }
  }
  out += '"';
}

void put_double(std::string& out, double v, const char* fmt = "%.6g") {
  if (!std::isfinite(v)) {
    out += "null";
    return;
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, v);
  out += buf;
}

void put_us(std::string& out, int64_t ns) { put_double(out, double(ns) / 1e3, "%.3f"); }

void put_args(std::string& out, const Event& e) {
  out += "\"args\":{";
  bool first = true;
  for (int k = 0; k < e.n_args; ++k) {
    const Arg& a = e.args[k];
    if (!first) out += ',';
    first = false;
    put_str(out, a.key ? a.key : "?");
    out += ':';
    switch (a.kind) {
      case Arg::Kind::Int: out += std::to_string(a.i); break;
      case Arg::Kind::Double: put_double(out, a.d); break;
      case Arg::Kind::Str: put_str(out, a.s ? a.s : ""); break;
    }
  }
  if (e.raw_key) {
    if (!first) out += ',';
    put_str(out, e.raw_key);
    out += ':';
    out += e.raw.empty() ? "null" : e.raw;
  }
  out += '}';
}

void put_event(std::string& out, const Event& e, int tid, int64_t origin) {
  const std::string tid_s = std::to_string(tid);
  auto head = [&](const char* ph, int64_t ts) {
    out += "{\"name\":";
    put_str(out, e.name ? e.name : "?");
    if (e.cat) {
      out += ",\"cat\":";
      put_str(out, e.cat);
    }
    out += ",\"ph\":\"";
    out += ph;
    out += "\",\"ts\":";
    put_us(out, ts - origin);
    out += ",\"pid\":1,\"tid\":" + tid_s;
  };
  switch (e.ph) {
    case 'X':
      head("X", e.ts);
      out += ",\"dur\":";
      put_us(out, e.dur);
      out += ',';
      put_args(out, e);
      out += "},\n";
      break;
    case 'A': {
      char id[32];
      std::snprintf(id, sizeof id, "\"0x%" PRIx64 "\"", e.id);
      head("b", e.ts);
      out += ",\"id\":";
      out += id;
      out += ',';
      put_args(out, e);
      out += "},\n";
      head("e", e.ts + e.dur);
      out += ",\"id\":";
      out += id;
      out += "},\n";
      break;
    }
    case 'C':
      head("C", e.ts);
      out += ',';
      put_args(out, e);
      out += "},\n";
      break;
    default: break;
  }
}

}  // namespace

int64_t now_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

const char* intern(std::string_view s) {
  Registry& r = reg();
  std::lock_guard<std::mutex> lk(r.mu);
  if (auto it = r.interned.find(s); it != r.interned.end()) return it->data();
  r.strings.emplace_back(s);
  r.interned.insert(r.strings.back());
  return r.strings.back().c_str();
}

void complete(const char* name, const char* cat, int64_t t0_ns, int64_t t1_ns, const Args& args,
              const char* raw_key, std::string_view raw_json) {
  if (!enabled()) return;
  ThreadBuf* b = local();
  Event* e = slot(b);
  if (!e) return;
  fill(*e, 'X', name, cat, t0_ns, t1_ns >= t0_ns ? t1_ns - t0_ns : 0, 0, args);
  if (raw_key) {
    e->raw_key = raw_key;
    e->raw.assign(raw_json);
  }
  publish(b);
}

void async_span(const char* name, const char* cat, uint64_t id, int64_t t0_ns, int64_t t1_ns, const Args& args) {
  if (!enabled()) return;
  ThreadBuf* b = local();
  Event* e = slot(b);
  if (!e) return;
  fill(*e, 'A', name, cat, t0_ns, t1_ns >= t0_ns ? t1_ns - t0_ns : 0, id, args);
  publish(b);
}

void counter(const char* name, int64_t t_ns, const Args& values) {
  if (!enabled()) return;
  ThreadBuf* b = local();
  Event* e = slot(b);
  if (!e) return;
  fill(*e, 'C', name, nullptr, t_ns, 0, 0, values);
  publish(b);
}

void set_thread_name(std::string_view name) {
  if (!enabled()) return;
  ThreadBuf* b = local();
  std::lock_guard<std::mutex> lk(reg().mu);
  b->name.assign(name);
}

namespace {
void put_meta(const char* key, std::string json) {
  Registry& r = reg();
  std::lock_guard<std::mutex> lk(r.mu);
  for (auto& [k, v] : r.meta)
    if (k == key) {
      v = std::move(json);
      return;
    }
  r.meta.emplace_back(key, std::move(json));
}
}  // namespace

void set_meta(const char* key, int64_t v) { put_meta(key, std::to_string(v)); }
void set_meta(const char* key, double v) {
  std::string s;
  put_double(s, v, "%.17g");
  put_meta(key, std::move(s));
}
void set_meta(const char* key, std::string_view v) {
  std::string s;
  put_str(s, v);
  put_meta(key, std::move(s));
}

void start(const std::string& p) {
  if (!p.empty()) {  // writable now, not found unwritable after the whole run (whose trace was then lost)
    const std::string tmp = p + ".tmp";
    std::FILE* f = std::fopen(tmp.c_str(), "wb");
    if (!f) fail(p, ": cannot write the profile");
    std::fclose(f);
    std::remove(tmp.c_str());
  }
  Registry& r = reg();
  {
    std::lock_guard<std::mutex> lk(r.mu);
    r.path = p;
    if (r.origin < 0) r.origin = now_ns();
  }
  detail::g_enabled.store(true, std::memory_order_release);
  set_thread_name("main");
}

void stop() { detail::g_enabled.store(false, std::memory_order_release); }

const std::string& path() { return reg().path; }

uint64_t dropped() { return reg().dropped.load(); }

namespace {
std::string render(size_t* n_events) {
  Registry& r = reg();
  std::lock_guard<std::mutex> lk(r.mu);
  const int64_t origin = r.origin < 0 ? now_ns() : r.origin;
  std::string out;
  size_t n_total = 0;
  for (const auto& b : r.bufs) n_total += b->n.load(std::memory_order_acquire);
  out.reserve(256 * (n_total + r.bufs.size()) + 1024);
  out += "{\"traceEvents\":[\n";
  out += "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":1,\"tid\":0,\"args\":{\"name\":\"firsttoken\"}},\n";
  for (const auto& b : r.bufs) {
    out += "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":" + std::to_string(b->tid) + ",\"args\":{\"name\":";
    put_str(out, b->name.empty() ? "thread " + std::to_string(b->tid) : b->name);
    out += "}},\n";
    out += "{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":1,\"tid\":" + std::to_string(b->tid) +
           ",\"args\":{\"sort_index\":" + std::to_string(b->tid) + "}},\n";
  }
  size_t written = 0;
  for (const auto& b : r.bufs) {
    const size_t n = b->n.load(std::memory_order_acquire);
    for (size_t i = 0; i < n; ++i) put_event(out, b->chunks[i / kChunkEvents][i % kChunkEvents], b->tid, origin);
    written += n;
  }
  // Drop the last ",\n" (there is always at least the process_name line).
  out.resize(out.size() - 2);
  out += "\n],\n\"displayTimeUnit\":\"ms\",\n\"otherData\":{\"generator\":\"firsttoken\",\"version\":1";
  out += ",\"events\":" + std::to_string(written);
  out += ",\"dropped_events\":" + std::to_string(r.dropped.load());
  for (const auto& [k, v] : r.meta) {
    out += ',';
    put_str(out, k);
    out += ':';
    out += v;
  }
  out += "}}\n";
  if (n_events) *n_events = written;
  return out;
}
}  // namespace

std::string to_json() { return render(nullptr); }

size_t write() { return write(path()); }

size_t write(const std::string& p) {
  if (p.empty()) fail("profile: no output file given");
  size_t n = 0;
  const std::string doc = render(&n);
  const std::string tmp = p + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) fail(p, ": cannot write the profile");
  const bool ok = std::fwrite(doc.data(), 1, doc.size(), f) == doc.size();
  if (std::fclose(f) != 0 || !ok) {
    std::remove(tmp.c_str());
    fail(p, ": cannot write the profile");
  }
  if (std::rename(tmp.c_str(), p.c_str()) != 0) {
    std::remove(tmp.c_str());
    fail(p, ": cannot write the profile");
  }
  return n;
}

void reset() {
  Registry& r = reg();
  std::lock_guard<std::mutex> lk(r.mu);
  std::vector<std::shared_ptr<ThreadBuf>> keep;
  for (auto& b : r.bufs) {
    if (!b->alive.load()) continue;
    b->n.store(0, std::memory_order_release);
    keep.push_back(b);
  }
  r.bufs.swap(keep);
  r.meta.clear();
  r.origin = enabled() ? now_ns() : -1;
  r.dropped.store(0);
}

}  // namespace ft::profile
