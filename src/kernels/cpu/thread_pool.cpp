// The persistent worker pool of thread_pool.h.
#include "kernels/cpu/thread_pool.h"

#include <chrono>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace ft::cpu {
namespace {

thread_local bool t_in_region = false;  // this thread is running some region's fn

class Pool {
 public:
  ~Pool() {
    {
      std::lock_guard lock(region_mu_);
      stop_.store(true);
      gen_.store(((gen_.load() >> kNtBits) + 1) << kNtBits);  // nt 0: nobody runs
      gen_.notify_all();
    }
    for (std::thread& w : workers_) w.join();
  }

  void run(int nt, void (*call)(void*, int, int), void* ctx) {
    nt = std::min(nt, kMaxThreads);
    if (nt <= 1 || t_in_region) {
      for (int t = 0; t < nt; ++t) call(ctx, t, nt);  // nested: inline, in order
      return;
    }
    std::lock_guard lock(region_mu_);
    while (int(workers_.size()) < nt - 1) {
      const int id = int(workers_.size()) + 1;
      // (It starts from the word before this region's bump: it may first run after the bump.)
      workers_.emplace_back([this, id, seen = gen_.load()] { work(id, seen); });
    }
    call_ = call;
    ctx_ = ctx;
    error_ = nullptr;
    pending_.store(nt - 1);
    // seq_cst: pairs with a worker's sleepers_ increment.
    gen_.store(((gen_.load() >> kNtBits) + 1) << kNtBits | uint32_t(nt));
    if (sleepers_.load() > 0) gen_.notify_all();
    run_one(0, nt);
    // The rest of the region is short unless a worker was preempted: spin, then yield the CPU.
    for (int spins = 0; pending_.load(std::memory_order_acquire) != 0; ++spins)
      if (spins < 4096) spin_pause();
      else std::this_thread::yield();
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void run_one(int t, int nt) {
    t_in_region = true;
    try {
      call_(ctx_, t, nt);
    } catch (...) {
      std::lock_guard lock(error_mu_);
      if (!error_) error_ = std::current_exception();
    }
    t_in_region = false;
  }

  void work(int id, uint32_t seen) {
    for (;;) {
      // Spin for kSpinUs (checking the clock every 64 pauses), then sleep until the next region.
      const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(kSpinUs);
      uint32_t g;
      for (int i = 0; (g = gen_.load(std::memory_order_acquire)) == seen; ++i) {
        spin_pause();
        if ((i & 63) == 63 && std::chrono::steady_clock::now() > until) {
          sleepers_.fetch_add(1);  // seq_cst: either run() sees it and notifies, or we see gen_
          gen_.wait(seen);
          sleepers_.fetch_sub(1);
        }
      }
      seen = g;
      if (stop_.load()) return;
      // Whether this worker is in the region comes from the word it woke on, not from a field
      // that the next region may already have rewritten.
      const int nt = int(g & ((1u << kNtBits) - 1));
      if (id < nt) {
        run_one(id, nt);
        pending_.fetch_sub(1, std::memory_order_release);
      }
    }
  }

  // Fields written by different threads sit on separate cache lines (no false sharing): the
  // caller writes gen_ and the region's call_/ctx_ together (the workers only read that line,
  // spinning on gen_), each worker decrements pending_ at the end of a region (the caller spins
  // on it), and a worker going to sleep bumps sleepers_ (read by the caller once per region).
  static constexpr int kNtBits = 12;
  static constexpr int kMaxThreads = (1 << kNtBits) - 1;
  // Per region: (a counter << kNtBits) | the region's thread count (32 bits: std::atomic::wait
  // is then a plain futex). A worker takes part when its id < the count in the word it woke on.
  alignas(64) std::atomic<uint32_t> gen_{0};
  // The current region; written by run() before gen_ is bumped, read by its workers after (and
  // not rewritten before they are done: run() waits for pending_).
  void (*call_)(void*, int, int) = nullptr;
  void* ctx_ = nullptr;
  std::atomic<bool> stop_{false};
  alignas(64) std::atomic<int> pending_{0};   // workers of this region not done yet
  alignas(64) std::atomic<int> sleepers_{0};  // workers blocked in gen_.wait
  // Rarely touched: region start-up, errors.
  alignas(64) std::mutex region_mu_;  // one region at a time
  std::vector<std::thread> workers_;
  std::mutex error_mu_;
  std::exception_ptr error_;
};

Pool& pool() {
  static Pool p;
  return p;
}

}  // namespace

void run_region(int nt, void (*call)(void* ctx, int t, int nt), void* ctx) { pool().run(nt, call, ctx); }

}  // namespace ft::cpu
