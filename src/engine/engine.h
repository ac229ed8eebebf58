// The serving engine: one thread owns the model, the KV cache and the scheduler (EngineCore);
// any thread submits requests and receives their events through a callback or an EventStream.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "core/error.h"
#include "engine/engine_core.h"
#include "engine/runtime_config.h"

namespace ft {

class Communicator;
class TpLeader;

inline constexpr int32_t kMinKvBlocks = 2;  // the smallest KV cache an engine runs with
// The most KV cache memory an engine takes unless told a size (EngineConfig::kv_memory_bytes):
// a model's context length is metadata, and sizing the cache from it alone would let a file ask
// for any amount of memory.
inline constexpr uint64_t kDefaultMaxKvBytes = 2ull << 30;
// A LoRA adapter loaded while the engine runs is packed between its steps, this long at a time
// (Engine::load_adapter): what each step of the streams then running pays.
inline constexpr double kAdapterPackSliceMs = 2.0;

struct EngineConfig {
  RuntimeConfig runtime;
  SchedulerConfig scheduler;
  uint64_t kv_memory_bytes = 0;  // 0 = room for 4 full contexts (at most kDefaultMaxKvBytes)
  bool prefix_caching = true;
  bool calibrate = true;  // measure the cost model at start-up (auto chunking needs it)
  double adapter_pack_slice_ms = kAdapterPackSliceMs;  // (0: one matrix a step, as tests take it)
  SpecConfig spec;        // speculative decoding (off by default)
  const Model* draft_model = nullptr;  // SpecMethod::Draft: loaded by the caller (load_draft_model)
  // Tensor/pipeline parallelism: rank 0 of this group (the model split for it: split_model, i.e.
  // Model::stage and Model::shard); the other ranks run run_tp_worker (engine/tensor_parallel.h).
  // Null: one process.
  Communicator* tp = nullptr;
};

// Loads a draft model for speculative decoding and checks it can draft for `target`: the same
// vocabulary (tokenizer.ggml.tokens, entry by entry). ft::Error naming both files otherwise.
// rope: the target's RoPE overrides, which the draft takes too (llama.cpp's server copies them):
// a draft unscaled past its trained context would predict noise where the target runs YaRN.
std::unique_ptr<Model> load_draft_model(const std::string& path, const Model& target, const RopeOverrides& rope = {});
void check_same_vocabulary(const Model& target, const Model& draft);

// The context an engine runs with: rt.n_ctx, or the model's when 0.
int64_t resolve_n_ctx(const RuntimeConfig& rt, const HParams& hp);
// `firsttoken run`'s engine: one sequence, fixed prompt chunks of `chunk` tokens, KV for exactly
// one context (n_ctx; 0 = the model's) or kDefaultMaxKvBytes when that is less (a request that
// needs more is refused as one that can never fit), no prefix cache, no calibration. Servers start from
// EngineConfig's defaults (server/config.h maps their settings onto it).
EngineConfig single_request_config(const Model& model, int64_t n_ctx, int64_t chunk, int threads,
                                   GGMLType kv_type = RuntimeConfig{}.kv_type);
// The KV cache of a model under rt (type, block size, heads), n_blocks blocks.
KVCacheConfig kv_cache_config(const RuntimeConfig& rt, const HParams& hp, int32_t n_blocks, bool prefix_caching);

// A snapshot for metrics.
struct EngineMetrics {
  EngineCounters counters;
  int32_t running = 0;
  int32_t waiting = 0;
  int32_t kv_total_blocks = 0;
  int32_t kv_used_blocks = 0;
  int32_t kv_cached_blocks = 0;
  int64_t kv_capacity_tokens = 0;  // positions the whole cache holds
  uint64_t kv_bytes = 0;           // its memory
  KVCacheStats kv;
  CostModel cost;                             // as learned so far
  PredictionErrorHistogram step_time_error;  // |predicted - measured| / measured forward time per step
  SpecMethod spec_method = SpecMethod::Off;
  uint64_t rejected_late = 0;                 // submissions refused by admission (DeadlineError)
};

// Engine::submit's refusal of a request that would miss its TTFT deadline by more than
// reject_late_factor (SchedulerConfig): the caller may retry after retry_after_s.
struct DeadlineError : Error {
  DeadlineError(const std::string& what, int64_t retry_after) : Error(what), retry_after_s(retry_after) {}
  int64_t retry_after_s;
};

// Engine::unload_adapter / find_adapter of a name that is not loaded.
struct AdapterNotFound : Error {
  using Error::Error;
};

// --mlock: pins in RAM what this process's forward pass reads: the backend's prepared copies, and
// the file's tensors it did not copy (norms, biases) or reads as rows anyway (the embedding
// table), of this rank's part of the model only (Model::reads_tensor: a pipeline stage locks its
// own layers). "weights locked in RAM (mlock): N MiB", or a warning saying why not (e.g.
// RLIMIT_MEMLOCK): the weights then stay pageable.
std::string lock_weights(const Model& model, Backend& backend);

class Engine {
 public:
  // is_eog: end-of-generation tokens (from the tokenizer). Starts the engine thread.
  Engine(const Model& model, const EngineConfig& cfg, std::function<bool(int32_t)> is_eog);
  ~Engine();  // cancels what is outstanding and joins the thread
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Validates and queues a request (throws ft::Error if invalid or if it can never fit; with
  // reject_late_factor, DeadlineError when its predicted TTFT under the queue is too late).
  // Resolves req.ttft_slo_ms (the default from the cost model learned so far).
  // cb runs on the engine thread for each token and once at the finish; it must not block.
  // Returns the request's id; its forks (EngineRequest::forks) are id + 1, id + 2, ...
  uint64_t submit(EngineRequest req, EventCallback cb);
  // Cancels a request at any time (its Finished event says Cancelled). Unknown ids are ignored.
  void cancel(uint64_t id);
  // Stops accepting work, cancels what is outstanding, joins the engine thread.
  void shutdown();

  // LoRA adapters by name (model/lora.h), from any thread. load_adapter maps and validates the
  // file (ft::Error naming it, the tensor, expected vs actual), packs it on the engine thread
  // between steps (kAdapterPackSliceMs a step), enables the forward's LoRA scratch there, and
  // registers it. max_active_adapters = 0 is an error, and so is a name already loaded unless
  // `replace` (vLLM's load_inplace): then requests that hold the old adapter finish with it, and
  // later ones take the new (its own prefix-cache salt: no block computed under the old is
  // reused); a replaced adapter that requests still hold counts against max_loaded_adapters until
  // they finish (each is a packed copy). unload_adapter waits up to `grace` for the requests that
  // hold the adapter (queued or running; a request a server answered at a stop string holds it
  // until the engine's next step; one call at a time waits, others do not), then refuses
  // (ft::Error saying how many); unknown names are AdapterNotFound. The destructor waits for the load_adapter
  // calls under way (those counted in adapter_loads_in_flight: shutdown ends their waits, and
  // they fail, "shutting down"); a call begun while the engine is being destroyed is the
  // caller's error, as any call on a destroyed object.
  std::shared_ptr<const LoraAdapter> load_adapter(const std::string& name, const std::string& path,
                                                  bool replace = false);
  static constexpr std::chrono::milliseconds kAdapterUnloadGrace{1000};
  void unload_adapter(const std::string& name, std::chrono::milliseconds grace = kAdapterUnloadGrace);
  std::shared_ptr<const LoraAdapter> find_adapter(const std::string& name) const;  // null: none
  int adapter_loads_in_flight() const;  // load_adapter calls under way
  // Names and files of the adapters loaded, and one's file (none: not loaded). (No copies of
  // the adapters: a copy held while listing made an unload racing with it "in use".)
  std::vector<std::pair<std::string, std::string>> adapter_files() const;
  std::optional<std::string> adapter_file(const std::string& name) const;

  EngineMetrics metrics() const;
  std::vector<StepRecord> recent_steps(size_t max) const;
  // Positions per sequence: the configured context (RuntimeConfig::n_ctx, else the model's), cut
  // to what the KV cache holds; context_warning() says so when it was cut ("" otherwise).
  int64_t n_ctx() const { return n_ctx_; }
  std::string context_warning() const;
  // "KV cache: N tokens (M MiB, DTYPE, B-token blocks)[, huge pages ...]": the start-up line.
  std::string kv_summary() const;
  // With RuntimeConfig::mlock: "weights locked in RAM (mlock): N MiB" or the warning saying why
  // not; else "".
  const std::string& weights_summary() const { return weights_summary_; }
  const SchedulerConfig& scheduler_config() const { return sched_cfg_; }
  double now_ms() const;  // the engine clock

 private:
  class ModelExecutor;
  class DraftModelRunner;
  void loop();
  CostModel calibrate();

  const Model& model_;
  int64_t n_ctx_ = 0;
  int64_t ctx_cut_from_ = 0;  // the context before the KV cache cut it (0: not cut)
  SchedulerConfig sched_cfg_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<TpLeader> tp_;  // tensor parallelism: the workers' steps
  std::unique_ptr<ModelExecutor> exec_;
  std::atomic<bool> lora_enabled_{false};  // exec_'s LoRA scratch is in (set on the engine thread)
  double adapter_pack_slice_ms_ = kAdapterPackSliceMs;  // (EngineConfig::adapter_pack_slice_ms)
  std::unique_ptr<DraftModelRunner> drafter_;
  std::unique_ptr<KVCache> kv_;
  std::unique_ptr<EngineCore> core_;
  std::chrono::steady_clock::time_point t0_;
  std::string weights_summary_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  struct Pending {
    uint64_t id;
    EngineRequest req;
    EventCallback cb;
    QueuedPrefill queued;  // for admission, until the core has it
  };
  // Finishes a request the core could not take (Error, with why) through its callback.
  void reject(Pending& p, const std::string& why);
  // Into the core (a failure rejects that request alone); then cleared.
  void add_to_core(std::deque<Pending>& adds);
  // The hook between the blocks of a step (EngineCore::between_blocks), what arrived since added first.
  void between_blocks(double done);
  std::deque<Pending> incoming_;
  std::atomic<bool> has_incoming_{false};  // incoming_ is not empty (set and cleared under mu_)
  std::vector<uint64_t> cancels_;
  std::vector<std::function<void()>> tasks_;  // run on the engine thread between steps
  int loads_in_flight_ = 0;                    // load_adapter calls under way (under mu_)
  std::condition_variable loads_cv_;           // (the destructor waits for them)
  mutable std::mutex adapters_mu_;
  std::map<std::string, std::shared_ptr<const LoraAdapter>> adapters_;  // under adapters_mu_
  std::vector<std::weak_ptr<const LoraAdapter>> replaced_;              // (load_inplace) still held; under adapters_mu_
  int64_t adapters_resident_locked();  // adapters_ and the replaced_ still alive (adapters_mu_ held)
  std::atomic<int> unloads_waiting_{0};  // unload_adapter calls under way (one may wait its grace)
  bool stop_ = false;
  uint64_t next_id_ = 1;
  EngineMetrics snapshot_;  // refreshed by the engine thread after each step
  std::vector<QueuedPrefill> queue_snapshot_;  // the core's prefills after the last step
  std::deque<StepRecord> steps_snapshot_;
  std::thread thread_;
};

// Blocking consumer of one request's events (for CLIs and tests): pass callback() to submit().
class EventStream {
 public:
  EventCallback callback();
  // Blocks until the next event; false after the Finished event has been returned.
  bool next(EngineEvent& ev, RequestTimings* timings = nullptr);

 private:
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<EngineEvent> events;
    RequestTimings timings;
    bool done = false;
  };
  std::shared_ptr<State> st_ = std::make_shared<State>();
  bool finished_ = false;
};

}  // namespace ft
