// A low-overhead tracer that writes Chrome trace JSON (opens in ui.perfetto.dev and
// chrome://tracing).
//
// Off (the default): every hook is one relaxed atomic load and a branch (enabled()).
// On (start()): each thread appends to its own event buffer, no lock on the hot path. A buffer is
// a list of fixed chunks of kChunkEvents events, allocated one chunk at a time (the first when the
// thread first records), so steady-state recording does not allocate per event; past
// kMaxEventsPerThread a thread's events are dropped and counted. The owner thread publishes each
// event with a release store of its count; write() reads counts with acquire, so it may run while
// other threads still record (it writes what was published).
//
// Events: complete spans ("ph":"X": name, category, start, duration, thread, up to kMaxArgs
// args plus one raw-JSON arg), async spans ("b"/"e" pairs with an id: one track per id, for
// per-request phases that cross threads), counters ("C"), and thread names ("M"). Timestamps are
// steady-clock nanoseconds; the file has microseconds relative to start().
#pragma once
#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>

namespace ft::profile {

namespace detail {
extern std::atomic<bool> g_enabled;
}

inline bool enabled() noexcept { return detail::g_enabled.load(std::memory_order_relaxed); }

// Steady clock, nanoseconds.
int64_t now_ns() noexcept;

constexpr int kMaxArgs = 14;  // (an engine step has up to 13)
constexpr size_t kChunkEvents = 4096;
constexpr size_t kMaxEventsPerThread = 1u << 21;  // ~2M events (~500 MiB) per thread at most

// A string that lives until the process exits (event names built at run time, e.g. weight
// names). Same text, same pointer. Takes a lock: call it at set-up, not per event.
const char* intern(std::string_view s);

struct Arg {
  enum class Kind : uint8_t { Int, Double, Str };
  const char* key = nullptr;  // a literal or intern()ed
  Kind kind = Kind::Int;
  union {
    int64_t i;
    double d;
    const char* s;  // a literal or intern()ed
  };
  Arg() : i(0) {}
};

// Up to kMaxArgs key/value pairs, built on the stack; extra pairs are ignored.
class Args {
 public:
  Args& i(const char* key, int64_t v) {
    if (Arg* a = next(key, Arg::Kind::Int)) a->i = v;
    return *this;
  }
  Args& d(const char* key, double v) {
    if (Arg* a = next(key, Arg::Kind::Double)) a->d = v;
    return *this;
  }
  Args& s(const char* key, const char* v) {
    if (Arg* a = next(key, Arg::Kind::Str)) a->s = v;
    return *this;
  }
  int size() const { return n_; }
  const Arg& operator[](int k) const { return a_[k]; }

 private:
  Arg* next(const char* key, Arg::Kind kind) {
    if (n_ == kMaxArgs) return nullptr;
    Arg& a = a_[n_++];
    a.key = key;
    a.kind = kind;
    return &a;
  }
  Arg a_[kMaxArgs];
  int n_ = 0;
};

// A complete span [t0, t1] on the calling thread. raw_key/raw_json: one extra arg whose value is
// already JSON (e.g. an array of chunk sizes); raw_json is copied (allocates only when long).
void complete(const char* name, const char* cat, int64_t t0_ns, int64_t t1_ns, const Args& args = {},
              const char* raw_key = nullptr, std::string_view raw_json = {});
// An async span [t0, t1] on the track of (cat, id); spans of one id nest by time.
void async_span(const char* name, const char* cat, uint64_t id, int64_t t0_ns, int64_t t1_ns,
                const Args& args = {});
// Counter values at t (one track per name, one series per arg; Int/Double args only).
void counter(const char* name, int64_t t_ns, const Args& values);
// Names the calling thread's track (no-op while off).
void set_thread_name(std::string_view name);
// Process-wide facts for the summary (model, memory sizes...), written under "otherData".
void set_meta(const char* key, int64_t v);
void set_meta(const char* key, double v);
void set_meta(const char* key, std::string_view v);

// Times a scope as a complete span (args added before it ends).
class Scope {
 public:
  Scope(const char* name, const char* cat) : name_(name), cat_(cat), on_(enabled()), t0_(on_ ? now_ns() : 0) {}
  ~Scope() {
    if (on_) complete(name_, cat_, t0_, now_ns(), args_);
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;
  Args& args() { return args_; }
  bool on() const { return on_; }

 private:
  const char* name_;
  const char* cat_;
  bool on_;
  int64_t t0_;
  Args args_;
};

// Turns recording on; write() will go to path. Events recorded before (by an earlier session)
// are kept unless reset() is called. Throws Error when path cannot be written (checked now; "":
// recording only, for to_json()).
void start(const std::string& path);
// Turns recording off (buffers are kept for write()).
void stop();
const std::string& path();
// Writes everything recorded so far as one Chrome trace JSON document to path() (through a
// temporary file and a rename, so the file is complete or absent). Returns the number of events
// written. Throws ft::Error when the file cannot be written.
size_t write();
size_t write(const std::string& path);
// The same document as a string (tests).
std::string to_json();
// Drops every event, counter and meta value. Only while no thread records.
void reset();
// Events dropped because a thread's buffer was full.
uint64_t dropped();

}  // namespace ft::profile
