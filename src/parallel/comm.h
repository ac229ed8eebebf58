// The process group of a parallel run over MPI (issue 18): rank 0 serves (HTTP, tokenizer,
// scheduler) and broadcasts each step to every rank. The world is tp x pp ranks: rank r is
// tensor-parallel rank r % tp of pipeline stage r / tp. Within a stage every rank runs the stage's
// layers on its shard of the weights, summing the row-parallel projections with one allreduce
// each over the stage's ranks; stage s sends its hidden state to stage s + 1 (tp rank t to tp
// rank t, point to point), and the last stage's tp rank 0 sends the rows that want logits back to
// rank 0 (first stage), which computes the logits.
//
// Every wait is bounded: a collective that has not completed within timeout_s() (a rank died or
// hangs) aborts the whole job (MPI_Abort) with a message naming the collective, so nothing hangs.
// The one unbounded wait is a worker's wait for the next step (broadcast_idle): a server may idle
// for hours, and rank 0's death ends the job through the launcher (mpirun kills the other ranks).
//
// Overlap of consecutive steps across stages: the step broadcasts (rank 0), the hidden state
// sent to the next stage and the last stage's rows sent back to rank 0 (which takes them after
// its part of the next step, when decode steps overlap) are posted, not waited on: their bytes
// are copied into buffers this communicator owns (a free list, so a step allocates nothing in
// the steady state) and the caller goes on with the next step while the next stage still runs
// the previous one. At most kPendingPerStage x pp_size operations (pp_size steps' worth: two
// broadcasts and one send each) stay in flight; one more waits for the oldest. They complete in
// order, and the oldest must complete within timeout_s() of becoming the oldest (else the job
// aborts, naming it); progress() (the forward pass calls it after each attention and FFN block)
// reaps what completed and drives MPI's progress (a large message's rendezvous needs the
// sender's), and drain() waits for all of them (rank 0 before it idles and before it stops the
// workers, a worker before it returns).
//
// MPI is optional at build time (CMake FT_MPI, find_package(MPI)): without it, start() refuses
// tp > 1 saying so. MPI calls are made by one thread at a time (MPI_THREAD_SERIALIZED): the main
// thread before and after the engine thread, the engine thread in between.
#pragma once
#include <cstdint>
#include <memory>
#include <exception>
#include <string>

#include "model/model.h"  // Reducer

namespace ft {

// Time and volume of the communication (the profile's and the bench's "communication per step").
struct CommStats {
  uint64_t allreduces = 0, allreduce_bytes = 0, allreduce_ns = 0;
  uint64_t broadcasts = 0, broadcast_bytes = 0, broadcast_ns = 0;
  // Pipeline sends and receives. The times of posted operations (broadcasts, sends) are the time
  // the caller was held: the post itself, and waits for a free slot or a drain.
  uint64_t transfers = 0, transfer_bytes = 0, transfer_ns = 0;
  uint64_t steps = 0;  // forward passes sent to the group (rank 0: TpLeader::send_step)
  uint64_t max_pending = 0;  // the most posted operations in flight at once (overlap: > a step's)
  uint64_t total_ns() const { return allreduce_ns + broadcast_ns + transfer_ns; }
};

class Communicator final : public Reducer, public StageLink {
 public:
  // True when this process was started by an MPI launcher with more than one rank (its
  // environment says so: OMPI_COMM_WORLD_SIZE, PMI_SIZE); sets *size to that world size.
  static bool launched_with_ranks(int* size);
  // Initializes MPI for a group of exactly tp x pp ranks and returns this rank's communicator;
  // tp = pp = 1: null (one process), unless an MPI launcher started several (an error: each would
  // serve alone). ft::Error when the build has no MPI, or when the world has another size (the
  // same error on every rank: MPI is finalized again before it is thrown).
  static std::unique_ptr<Communicator> start(int tp, int pp = 1);
  ~Communicator() override;  // MPI_Finalize (all ranks reach it on a clean stop)

  // Runs fn; what it throws ends every rank (abort), for the part of a run after the ranks have
  // agreed to start, where one rank's error would leave the others waiting.
  template <class F>
  auto or_abort(F&& fn) -> decltype(fn()) {
    try {
      return fn();
    } catch (const std::exception& e) {
      abort(e.what());
    }
  }

  int rank() const { return rank_; }
  int size() const { return size_; }  // the world: tp_size() x pp_size()
  int tp_size() const { return tp_; }
  int pp_size() const { return size_ / tp_; }
  int tp_rank() const { return rank_ % tp_; }
  int stage() const { return rank_ / tp_; }
  double timeout_s() const { return timeout_s_; }

  // x (n,) = the sum over the ranks of this rank's stage of their x (f32), in place.
  void allreduce_sum(float* x, int64_t n) override;
  // Pipeline (StageLink): point-to-point, nonblocking, waited on with the collectives' deadline.
  bool first_stage() const override { return stage() == 0; }
  bool last_stage() const override { return stage() == pp_size() - 1; }
  void recv_prev(float* x, int64_t n) override;
  void send_next(const float* x, int64_t n) override;
  void send_head(const float* x, int64_t n) override;  // (from the last stage's tp rank 0 only)
  void recv_tail(float* x, int64_t n) override;
  void progress() override;
  // bytes at data: rank 0's are copied to every rank. broadcast_idle waits without a time limit.
  void broadcast(void* data, int64_t bytes);
  void broadcast_idle(void* data, int64_t bytes);
  // Rank 0's side of a broadcast, posted (data copied; the others take it with broadcast or
  // broadcast_idle, in the same order).
  void post_broadcast(const void* data, int64_t bytes);
  // Waits (each under the deadline) until every posted operation has completed.
  void drain();
  // Posted operations not yet known complete.
  size_t pending() const;
  static constexpr int kPendingPerStage = 3;  // a step's posts: its two broadcasts, one send
  // Whether every rank passed ok (start-up agreement: each rank prints its own error, then all
  // stop together).
  bool all_ok(bool ok);
  // Ends every rank of the job at once (MPI_Abort) after printing why.
  [[noreturn]] void abort(const std::string& why);

  const CommStats& stats() const { return stats_; }
  void count_step() { ++stats_.steps; }

 private:
  Communicator() = default;
  void transfer(float* x, int64_t n, int peer, int tag, bool send, const char* what);
  // Posts a send to peer (peer < 0: rank 0's broadcast) of a copy of bytes at x.
  void post(const void* x, int64_t bytes, int peer, int tag, const char* what);
  // Tests the posted operations; frees the completed ones at the head; aborts past the deadline.
  void reap();
  // Waits until at most n posted operations are left.
  void wait_pending(size_t n);
  struct Impl;  // the MPI handles (the stage's communicator)
  std::unique_ptr<Impl> impl_;
  int rank_ = 0, size_ = 1, tp_ = 1;
  double timeout_s_ = 60;
  CommStats stats_;
};

}  // namespace ft
