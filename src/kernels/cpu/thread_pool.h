// The fast kernels' worker threads: one persistent pool per process that runs a parallel region
// (a GEMM, an attention call, a RoPE) on the caller plus up to threads - 1 workers.
//
// Why not OpenMP: a decode step on a 1.1B model is ~110 regions of 20-150 us each, and an
// OpenMP region cost 16-20 us of fork/join on these VMs (measured: an empty `omp parallel` of
// 2 threads), so the second thread bought little. Here a region is one atomic generation bump
// that spinning workers see within ~100 ns; between regions workers spin for kSpinUs, then sleep
// on a futex (an idle server costs no CPU), and the caller only issues the wake-up syscall when
// some worker sleeps.
//
// Contract: fn must not start another region from inside (a nested call runs inline on the
// calling thread, serially, so it is correct but not parallel). Regions from different caller
// threads are serialized (one engine thread is the normal case; tests may run several). An
// exception thrown by fn on any thread is rethrown on the caller after the region ends.
#pragma once
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <limits>
#include <thread>
#include <utility>

namespace ft::cpu {

// Workers spin this long after a region before sleeping (the gap between two regions of one
// forward pass is a few us; between two decode steps, sampling and scheduling: tens of us).
inline constexpr int64_t kSpinUs = 200;

// Threads up to which parallel_for_split_runs_in splits the items into per-thread ranges.
inline constexpr int kMaxSplitRanges = 64;

// One step of a spin-wait loop.
inline void spin_pause() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::this_thread::yield();
#endif
}

// Runs call(ctx, t, nt) once for each t in [0, nt), t = 0 on the calling thread, the others on
// pool workers (started on first use; the pool grows to the largest nt asked for).
void run_region(int nt, void (*call)(void* ctx, int t, int nt), void* ctx);

// fn(t, nt) once on each of nt threads.
template <class F>
void parallel(int nt, F&& fn) {
  using Fn = std::remove_reference_t<F>;
  run_region(std::max(1, nt), [](void* c, int t, int n) { (*static_cast<Fn*>(c))(t, n); }, &fn);
}

// No per-thread state (parallel_for_runs_in's default).
struct NoScope {
  template <class A>
  explicit NoScope(const A&) {}
};

// The next run's length in parallel_for_guided_runs_in: with `left` items left among `nt`
// threads, ceil(left / (2 nt)) items, at most `chunk`, rounded up to a multiple of `granule`
// (chunk is one).
inline int64_t guided_run(int64_t left, int nt, int64_t chunk, int64_t granule) {
  const int64_t share = (left + 2 * int64_t(nt) - 1) / (2 * int64_t(nt));
  return std::max(granule, (std::min(chunk, share) + granule - 1) / granule * granule);
}

// fn(b, e) over [0, n) in runs that shrink as the items run out (OpenMP's schedule(guided),
// capped at `chunk`, a multiple of `granule`): runs of `chunk` while much is left, then
// guided_run's, down to one granule, so the threads end within one small run of each other.
// (A decode GEMV's runs stream >= 512 KB each: with fixed runs the two threads ended 6.6 us
// apart in a ~75 us GEMV, 11.5 in a ~230 us one; with these, 1.3 and 5.) Each run is still one
// ascending range of items, handed out in order.
template <class Scope, class A, class F>
void parallel_for_guided_runs_in(const A& arg, int64_t n, int nt, int64_t chunk, int64_t granule, F&& fn) {
  granule = std::max<int64_t>(1, granule);
  chunk = std::max(granule, (chunk + granule - 1) / granule * granule);
  if (nt <= 1 || n <= granule) {
    const Scope scope(arg);
    for (int64_t b = 0; b < n; b += chunk) fn(b, std::min(n, b + chunk));
    return;
  }
  std::atomic<int64_t> next{0};
  const int used = int(std::min<int64_t>(nt, (n + granule - 1) / granule));
  parallel(used, [&](int, int) {
    const Scope scope(arg);
    int64_t b = next.load(std::memory_order_relaxed);
    while (b < n) {
      const int64_t e = std::min(n, b + guided_run(n - b, used, chunk, granule));
      if (!next.compare_exchange_weak(b, e, std::memory_order_relaxed)) continue;  // (b reloaded)
      fn(b, e);
      b = next.load(std::memory_order_relaxed);
    }
  });
}

// Split runs of [0, n): thread t starts on the t-th contiguous share of the items (its range,
// bounded on granules) and takes ascending runs from its front, each half of what is left there
// (a multiple of `granule`; at most max_run), so one thread's runs follow each other in memory as one stream and
// the threads' streams start far apart, as a read probe's do. A thread whose range is done takes
// runs of half what is left from the back of the next unfinished range, so the threads still end
// within one small run of each other. Decode step time against guided runs (which hand out
// adjacent runs to the threads in turn), --ab: tinyllama Q4_0, Q8_0, Q4_K_M 0.985x (median of
// 12 runs, 10 faster), F16 0.99x; 110m Q8_0 0.89-0.92x (its GEMVs are small, 0.3-1.7 MB).
// One object per parallel region, each of whose threads calls take(t, fn) once; n < 2^32 (fits).
class SplitRuns {
 public:
  static bool fits(int64_t n) { return n >= 0 && n < (int64_t(1) << 32); }

  // Front runs at most max_run items (rounded up to a granule): where a run's items are
  // revisited after it (gemm_run's passes), so that they are still in cache.
  SplitRuns(int64_t n, int nt, int64_t granule, int64_t max_run = std::numeric_limits<int64_t>::max())
      : granule_(std::max<int64_t>(1, granule)),
        max_run_(up(std::max<int64_t>(1, std::min(max_run, n)))),
        ranges_used_(int(std::clamp<int64_t>(n / granule_, 1, std::clamp(nt, 1, kMaxSplitRanges)))) {
    const int64_t granules = n / granule_;
    auto bound = [&](int t) { return t == ranges_used_ ? n : granules * t / ranges_used_ * granule_; };
    for (int t = 0; t < ranges_used_; ++t)
      ranges_[t].front_back.store(uint64_t(bound(t)) | uint64_t(bound(t + 1)) << 32, std::memory_order_relaxed);
  }

  // fn(b, e) for each run that thread t takes, until no item is left. Threads t >= the ranges
  // (more threads than items or than kMaxSplitRanges) only take from the others' backs.
  template <class F>
  void take(int t, F&& fn) {
    const bool owner = t < ranges_used_;
    for (int k = owner ? 0 : 1; k <= ranges_used_; ++k) {  // (k = 0: its own range, from the front)
      std::atomic<uint64_t>& fb = ranges_[(t + k) % ranges_used_].front_back;
      const bool front_run = owner && k == 0;
      uint64_t cur = fb.load(std::memory_order_relaxed);
      for (;;) {
        const int64_t front = int64_t(cur & 0xffffffffu), back = int64_t(cur >> 32);
        if (front >= back) break;
        const int64_t left = back - front, half = std::min(max_run_, up((left + 1) / 2));
        const int64_t b = front_run ? front : front + up(std::max<int64_t>(0, left - half));  // (on a granule)
        const int64_t e = front_run ? std::min(back, front + half) : back;
        const uint64_t next = front_run ? uint64_t(e) | uint64_t(back) << 32 : uint64_t(front) | uint64_t(b) << 32;
        if (!fb.compare_exchange_weak(cur, next, std::memory_order_relaxed)) continue;  // (cur reloaded)
        fn(b, e);
        cur = fb.load(std::memory_order_relaxed);
      }
    }
  }

 private:
  int64_t up(int64_t x) const { return (x + granule_ - 1) / granule_ * granule_; }

  struct alignas(64) Range {
    std::atomic<uint64_t> front_back;  // (front | back << 32): [front, back) not yet taken
  };
  int64_t granule_, max_run_;
  int ranges_used_;
  Range ranges_[kMaxSplitRanges];
};

// fn(b, e) over [0, n) in SplitRuns' runs, each thread in a Scope(arg) (guided runs of at most
// max_run where there is one thread or n does not fit).
template <class Scope, class A, class F>
void parallel_for_split_runs_in(const A& arg, int64_t n, int nt, int64_t granule, F&& fn,
                                int64_t max_run = std::numeric_limits<int64_t>::max()) {
  const int used = int(std::min<int64_t>(std::max(1, nt), n / std::max<int64_t>(1, granule)));
  if (used <= 1 || !SplitRuns::fits(n)) {
    parallel_for_guided_runs_in<Scope>(arg, n, nt, std::max<int64_t>(1, std::min(n, max_run)), granule, std::forward<F>(fn));
    return;
  }
  SplitRuns runs(n, used, granule, max_run);
  parallel(used, [&](int t, int) {
    const Scope scope(arg);
    runs.take(t, fn);
  });
}

// fn(b, e) over [0, n) in runs [b, e) of `chunk` consecutive items, handed out in order to
// whichever thread asks next (OpenMP's schedule(dynamic, chunk)); inline, run by run, when
// nt <= 1 or n <= chunk. Each thread that takes runs holds a Scope(arg) around all of them
// (a per-thread state such as an FP mode, set once per thread rather than once per run).
template <class Scope, class A, class F>
void parallel_for_runs_in(const A& arg, int64_t n, int nt, int64_t chunk, F&& fn) {
  chunk = std::max<int64_t>(1, chunk);  // (a granule of `chunk`: every run that long)
  parallel_for_guided_runs_in<Scope>(arg, n, nt, chunk, chunk, std::forward<F>(fn));
}
template <class F>
void parallel_for_runs(int64_t n, int nt, int64_t chunk, F&& fn) {
  parallel_for_runs_in<NoScope>(0, n, nt, chunk, std::forward<F>(fn));
}

// fn(i) for every i in [0, n), in parallel_for_runs's runs (each thread in a Scope(arg)).
template <class Scope, class A, class F>
void parallel_for_in(const A& arg, int64_t n, int nt, int64_t chunk, F&& fn) {
  parallel_for_runs_in<Scope>(arg, n, nt, chunk, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) fn(i);
  });
}
template <class F>
void parallel_for(int64_t n, int nt, int64_t chunk, F&& fn) {
  parallel_for_in<NoScope>(0, n, nt, chunk, std::forward<F>(fn));
}

// fn(i) for every i in [0, n), thread t taking the t-th contiguous nt-th (OpenMP's
// schedule(static)): for rows of equal cost, no shared counter.
template <class F>
void parallel_for_static(int64_t n, int nt, F&& fn) {
  if (nt <= 1 || n <= 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  const int used = int(std::min<int64_t>(nt, n));
  parallel(used, [&](int t, int u) {
    for (int64_t i = n * t / u, e = n * (t + 1) / u; i < e; ++i) fn(i);
  });
}

}  // namespace ft::cpu
