#include "parallel/comm.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <deque>
#include <thread>
#include <vector>

#include "core/error.h"
#include "profile/trace.h"

#ifdef FT_HAVE_MPI
#include <mpi.h>
#endif

namespace ft {

namespace {

// The launcher's world size from the environment, 0 when not started by one.
int env_world_size() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"})
    if (const char* s = std::getenv(v)) return std::atoi(s);
  return 0;
}

}  // namespace

bool Communicator::launched_with_ranks(int* size) {
  const int n = env_world_size();
  if (size) *size = n;
  return n > 1;
}

namespace {
// tp = pp = 1: null, or the error of a multi-rank launch for one rank's work.
bool one_process(int tp, int pp) {
  if (tp < 1 || pp < 1) fail("parallelism: tp_size ", tp, ", pp_size ", pp, " (each at least 1)");
  if (int64_t(tp) * pp > (1 << 16)) fail("parallelism: tp_size x pp_size = ", int64_t(tp) * pp, " ranks");
  if (tp * pp > 1) return false;
  if (int world = 0; Communicator::launched_with_ranks(&world))
    fail("started as one of ", world, " MPI ranks, but tp_size x pp_size is 1: set parallel_config.tp_size (--tp) "
         "and/or pp_size (--pp) so that their product is ", world, ", or start one process");
  return true;
}
}  // namespace

#ifdef FT_HAVE_MPI

// A posted operation and the copy of its bytes (valid until it completes).
struct Posted {
  MPI_Request r = MPI_REQUEST_NULL;  // MPI_REQUEST_NULL once complete
  std::vector<char> buf;
  const char* what = "";
  int peer = -1;  // -1: a broadcast
};

struct Communicator::Impl {
  MPI_Comm stage = MPI_COMM_NULL;  // the ranks of this rank's pipeline stage (the allreduces')
  std::deque<Posted> posted;       // in posting order
  std::vector<std::vector<char>> spare;  // freed buffers, reused by the next posts
  uint64_t head_since_ns = 0;      // when posted.front() became the oldest
};

namespace {

uint64_t now_ns() {
  return uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::steady_clock::now().time_since_epoch())
                      .count());
}

// Polls r until it completes. Tight polling first (a decode step's allreduce answers in
// microseconds), then yielding, then short sleeps (the cores are shared with the other ranks'
// compute). timeout_s <= 0: no limit. Returns false on timeout.
bool wait_request(MPI_Request& r, double timeout_s) {
  const uint64_t t0 = now_ns();
  const uint64_t limit = timeout_s > 0 ? uint64_t(timeout_s * 1e9) : UINT64_MAX;
  for (uint64_t polls = 0;; ++polls) {
    int done = 0;
    MPI_Test(&r, &done, MPI_STATUS_IGNORE);
    if (done) return true;
    if (polls < 256) continue;
    const uint64_t waited = now_ns() - t0;
    if (waited > limit) return false;
    if (waited < 2'000'000) std::this_thread::yield();
    else std::this_thread::sleep_for(std::chrono::microseconds(waited < 100'000'000 ? 50 : 1000));
  }
}

}  // namespace

std::unique_ptr<Communicator> Communicator::start(int tp, int pp) {
  if (one_process(tp, pp)) return nullptr;
  const int size = tp * pp;
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited) {
    int provided = 0;
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
    if (provided < MPI_THREAD_SERIALIZED) {
      MPI_Finalize();
      fail("MPI: the library gives thread level ", provided, ", the engine needs MPI_THREAD_SERIALIZED");
    }
  }
  std::unique_ptr<Communicator> c(new Communicator());
  MPI_Comm_rank(MPI_COMM_WORLD, &c->rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &c->size_);
  // Errors come back as codes (checked), not the default handler's abort without a message.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  if (const char* t = std::getenv("FT_MPI_TIMEOUT_S")) c->timeout_s_ = std::atof(t);
  if (c->size_ != size) {
    // Every rank sees the same mismatch and says it before any exits (mpirun ends the others at
    // the first non-zero exit, which took a rank's message with it now and then): each prints,
    // then all_ok's barrier (timed, as every collective here), then finalizes and stops, as
    // tp_agree (serve) does.
    say_error(cat("parallelism: tp_size x pp_size = ", tp, " x ", pp, " = ", size, " but the job has ", c->size_,
                  " MPI ranks (start it with mpirun -n ", size, ")"));
    c->all_ok(false);
    c.reset();  // (finalizes)
    fail("parallelism: start-up failed (the error above)");
  }
  c->tp_ = tp;
  c->impl_ = std::make_unique<Impl>();
  // A stage's ranks, in tp-rank order (MPI_Comm_split: collective over the world).
  if (MPI_Comm_split(MPI_COMM_WORLD, c->stage(), c->tp_rank(), &c->impl_->stage) != MPI_SUCCESS)
    c->abort("MPI_Comm_split failed");
  MPI_Comm_set_errhandler(c->impl_->stage, MPI_ERRORS_RETURN);
  return c;
}

Communicator::~Communicator() {
  if (impl_) drain();  // (a clean stop drained already)
  if (impl_ && impl_->stage != MPI_COMM_NULL) MPI_Comm_free(&impl_->stage);
  int fin = 0;
  MPI_Finalized(&fin);
  if (!fin) MPI_Finalize();
}

void Communicator::allreduce_sum(float* x, int64_t n) {
  profile::Scope sc("allreduce", "comm");
  const uint64_t t0 = now_ns();
  MPI_Request r;
  if (n > INT32_MAX) fail("allreduce: ", n, " floats exceed one MPI message");
  if (MPI_Iallreduce(MPI_IN_PLACE, x, int(n), MPI_FLOAT, MPI_SUM, impl_->stage, &r) != MPI_SUCCESS)
    abort("MPI_Iallreduce failed");
  if (!wait_request(r, timeout_s_))
    abort(cat("allreduce of ", n, " floats: no answer from the other ranks within ", timeout_s_,
              " s (a rank died or hangs)"));
  ++stats_.allreduces;
  stats_.allreduce_bytes += uint64_t(n) * sizeof(float);
  stats_.allreduce_ns += now_ns() - t0;
}

// One point-to-point transfer of n floats with peer (tags: kHidden stage to stage, kTail the last
// stage to rank 0; pairs' messages arrive in order, and every rank makes its calls in the same
// order per step, so a tag per direction suffices).
namespace {
enum : int { kHidden = 11, kTail = 12 };
}

void Communicator::transfer(float* x, int64_t n, int peer, int tag, bool send, const char* what) {
  // (Bytes on the wire, as the posted sends': the types of a send and its receive must match.)
  profile::Scope sc(what, "comm");
  const uint64_t t0 = now_ns();
  if (n > INT32_MAX / int64_t(sizeof(float))) fail(what, ": ", n, " floats exceed one MPI message");
  const int bytes = int(n) * int(sizeof(float));
  MPI_Request r;
  const int rc = send ? MPI_Isend(x, bytes, MPI_BYTE, peer, tag, MPI_COMM_WORLD, &r)
                      : MPI_Irecv(x, bytes, MPI_BYTE, peer, tag, MPI_COMM_WORLD, &r);
  if (rc != MPI_SUCCESS) abort(cat(what, ": MPI_I", send ? "send" : "recv", " failed"));
  if (!wait_request(r, timeout_s_))
    abort(cat(what, " of ", n, " floats ", send ? "to" : "from", " rank ", peer, ": no answer within ", timeout_s_,
              " s (a rank died or hangs)"));
  ++stats_.transfers;
  stats_.transfer_bytes += uint64_t(n) * sizeof(float);
  stats_.transfer_ns += now_ns() - t0;
}

void Communicator::post(const void* x, int64_t bytes, int peer, int tag, const char* what) {
  const uint64_t t0 = now_ns();
  if (bytes > INT32_MAX) fail(what, ": ", bytes, " bytes exceed one MPI message");
  // A slot: the oldest post completes first (the stages take steps in order).
  const size_t cap = size_t(kPendingPerStage) * size_t(pp_size());
  reap();
  if (impl_->posted.size() >= cap) wait_pending(cap - 1);
  Impl& im = *impl_;
  Posted& p = im.posted.emplace_back();
  if (im.posted.size() == 1) im.head_since_ns = t0;
  if (!im.spare.empty()) {
    p.buf = std::move(im.spare.back());
    im.spare.pop_back();
  }
  p.buf.resize(size_t(bytes));
  if (bytes > 0) std::memcpy(p.buf.data(), x, size_t(bytes));
  p.what = what;
  p.peer = peer;
  const int rc = peer < 0 ? MPI_Ibcast(p.buf.data(), int(bytes), MPI_BYTE, 0, MPI_COMM_WORLD, &p.r)
                          : MPI_Isend(p.buf.data(), int(bytes), MPI_BYTE, peer, tag, MPI_COMM_WORLD, &p.r);
  if (rc != MPI_SUCCESS) abort(cat(what, ": ", peer < 0 ? "MPI_Ibcast" : "MPI_Isend", " failed"));
  stats_.max_pending = std::max<uint64_t>(stats_.max_pending, im.posted.size());
  const uint64_t dt = now_ns() - t0;
  if (peer < 0) {
    ++stats_.broadcasts;
    stats_.broadcast_bytes += uint64_t(bytes);
    stats_.broadcast_ns += dt;
  } else {
    ++stats_.transfers;
    stats_.transfer_bytes += uint64_t(bytes);
    stats_.transfer_ns += dt;
  }
}

void Communicator::reap() {
  Impl& im = *impl_;
  for (Posted& p : im.posted) {
    if (p.r == MPI_REQUEST_NULL) continue;
    int done = 0;
    MPI_Test(&p.r, &done, MPI_STATUS_IGNORE);  // (sets p.r to MPI_REQUEST_NULL when done)
  }
  bool popped = false;
  while (!im.posted.empty() && im.posted.front().r == MPI_REQUEST_NULL) {
    im.spare.push_back(std::move(im.posted.front().buf));
    im.posted.pop_front();
    popped = true;
  }
  if (im.posted.empty()) return;
  const uint64_t now = now_ns();
  if (popped) im.head_since_ns = now;
  if (timeout_s_ > 0 && now - im.head_since_ns > uint64_t(timeout_s_ * 1e9)) {
    const Posted& h = im.posted.front();
    abort(cat(h.what, " of ", h.buf.size(), " bytes ", h.peer < 0 ? std::string("to every rank")
                                                                    : cat("to rank ", h.peer),
              ": not taken within ", timeout_s_, " s (a rank died or hangs)"));
  }
}

void Communicator::wait_pending(size_t n) {
  if (impl_->posted.size() <= n) return;
  profile::Scope sc("pp_wait", "comm");
  const uint64_t t0 = now_ns();
  for (uint64_t polls = 0;; ++polls) {
    reap();  // (aborts past the deadline)
    if (impl_->posted.size() <= n) break;
    if (polls < 256) continue;
    const uint64_t waited = now_ns() - t0;
    if (waited < 2'000'000) std::this_thread::yield();
    else std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  stats_.transfer_ns += now_ns() - t0;
}

void Communicator::drain() { wait_pending(0); }
void Communicator::progress() { reap(); }
size_t Communicator::pending() const { return impl_ ? impl_->posted.size() : 0; }
void Communicator::post_broadcast(const void* data, int64_t bytes) {
  if (rank_ != 0) fail("post_broadcast: only rank 0 broadcasts");
  profile::Scope sc("broadcast", "comm");
  post(data, bytes, -1, 0, "broadcast");
}

void Communicator::recv_prev(float* x, int64_t n) { transfer(x, n, rank_ - tp_, kHidden, false, "pp_recv"); }
void Communicator::send_next(const float* x, int64_t n) {
  profile::Scope sc("pp_send", "comm");
  if (n > INT32_MAX / int64_t(sizeof(float))) fail("pp_send: ", n, " floats exceed one MPI message");
  post(x, n * int64_t(sizeof(float)), rank_ + tp_, kHidden, "pp_send");
}
void Communicator::send_head(const float* x, int64_t n) {
  // Posted, as send_next: the stage goes on with the next step while rank 0 still runs its stage-0
  // part (overlapped decode steps) before it takes these rows.
  if (!last_stage() || tp_rank() != 0) return;
  profile::Scope sc("pp_send", "comm");
  if (n > INT32_MAX / int64_t(sizeof(float))) fail("pp_send: ", n, " floats exceed one MPI message");
  post(x, n * int64_t(sizeof(float)), 0, kTail, "pp_send");
}
void Communicator::recv_tail(float* x, int64_t n) {
  if (rank_ == 0) transfer(x, n, (pp_size() - 1) * tp_, kTail, false, "pp_recv");
}

static void bcast(Communicator& c, CommStats& st, void* data, int64_t bytes, double timeout_s) {
  const uint64_t t0 = now_ns();
  if (bytes > INT32_MAX) fail("broadcast: ", bytes, " bytes exceed one MPI message");
  MPI_Request r;
  if (MPI_Ibcast(data, int(bytes), MPI_BYTE, 0, MPI_COMM_WORLD, &r) != MPI_SUCCESS) c.abort("MPI_Ibcast failed");
  if (!wait_request(r, timeout_s))
    c.abort(cat("broadcast of ", bytes, " bytes: no answer from the other ranks within ", timeout_s,
                " s (a rank died or hangs)"));
  ++st.broadcasts;
  st.broadcast_bytes += uint64_t(bytes);
  st.broadcast_ns += now_ns() - t0;
}

void Communicator::broadcast(void* data, int64_t bytes) {
  profile::Scope sc("broadcast", "comm");
  bcast(*this, stats_, data, bytes, timeout_s_);
}
void Communicator::broadcast_idle(void* data, int64_t bytes) { bcast(*this, stats_, data, bytes, 0); }

bool Communicator::all_ok(bool ok) {
  int v = ok ? 1 : 0;
  MPI_Request r;
  if (MPI_Iallreduce(MPI_IN_PLACE, &v, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD, &r) != MPI_SUCCESS)
    abort("MPI_Iallreduce failed");
  if (!wait_request(r, timeout_s_)) abort(cat("start-up: no answer from the other ranks within ", timeout_s_, " s"));
  return v == 1;
}

void Communicator::abort(const std::string& why) {
  std::fprintf(stderr, "firsttoken: rank %d of %d: %s; stopping every rank\n", rank_, size_, why.c_str());
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 3);
  std::_Exit(3);
}

#else  // built without MPI

std::unique_ptr<Communicator> Communicator::start(int tp, int pp) {
  if (one_process(tp, pp)) return nullptr;
  const int size = tp * pp;
  fail("tensor parallelism (", size, " ranks) needs MPI, and this build has none: install OpenMPI "
       "(apt-get install libopenmpi-dev openmpi-bin) and reconfigure (cmake -DFT_MPI=ON)");
}
Communicator::~Communicator() = default;
void Communicator::allreduce_sum(float*, int64_t) {}
void Communicator::broadcast(void*, int64_t) {}
void Communicator::broadcast_idle(void*, int64_t) {}
void Communicator::recv_prev(float*, int64_t) {}
void Communicator::send_next(const float*, int64_t) {}
void Communicator::send_head(const float*, int64_t) {}
void Communicator::recv_tail(float*, int64_t) {}
void Communicator::progress() {}
void Communicator::post_broadcast(const void*, int64_t) {}
void Communicator::drain() {}
size_t Communicator::pending() const { return 0; }
bool Communicator::all_ok(bool ok) { return ok; }
void Communicator::abort(const std::string& why) {
  std::fprintf(stderr, "firsttoken: %s\n", why.c_str());
  std::_Exit(3);
}

#endif

}  // namespace ft
