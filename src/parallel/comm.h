// The process group of a tensor-parallel run over MPI (issue 18): rank 0 serves (HTTP, tokenizer,
// scheduler) and broadcasts each step; every rank runs the step's forward on its shard of the
// weights, summing the row-parallel projections with one allreduce each.
//
// Every wait is bounded: a collective that has not completed within timeout_s() (a rank died or
// hangs) aborts the whole job (MPI_Abort) with a message naming the collective, so nothing hangs.
// The one unbounded wait is a worker's wait for the next step (broadcast_idle): a server may idle
// for hours, and rank 0's death ends the job through the launcher (mpirun kills the other ranks).
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

// Time and volume of the collectives (the profile's and the bench's "communication per step").
struct CommStats {
  uint64_t allreduces = 0, allreduce_bytes = 0, allreduce_ns = 0;
  uint64_t broadcasts = 0, broadcast_bytes = 0, broadcast_ns = 0;
};

class Communicator final : public Reducer {
 public:
  // True when this process was started by an MPI launcher with more than one rank (its
  // environment says so: OMPI_COMM_WORLD_SIZE, PMI_SIZE); sets *size to that world size.
  static bool launched_with_ranks(int* size);
  // Initializes MPI for a group of exactly `size` ranks and returns this rank's communicator;
  // size 1: null (one process), unless an MPI launcher started several (an error: each would
  // serve alone). ft::Error when the build has no MPI, or when the world has another size (the
  // same error on every rank: MPI is finalized again before it is thrown).
  static std::unique_ptr<Communicator> start(int size);
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
  int size() const { return size_; }
  double timeout_s() const { return timeout_s_; }

  // x (n,) = the sum over ranks of every rank's x (f32), in place.
  void allreduce_sum(float* x, int64_t n) override;
  // bytes at data: rank 0's are copied to every rank. broadcast_idle waits without a time limit.
  void broadcast(void* data, int64_t bytes);
  void broadcast_idle(void* data, int64_t bytes);
  // Whether every rank passed ok (start-up agreement: each rank prints its own error, then all
  // stop together).
  bool all_ok(bool ok);
  // Ends every rank of the job at once (MPI_Abort) after printing why.
  [[noreturn]] void abort(const std::string& why);

  const CommStats& stats() const { return stats_; }

 private:
  Communicator() = default;
  int rank_ = 0, size_ = 1;
  double timeout_s_ = 60;
  CommStats stats_;
};

}  // namespace ft
