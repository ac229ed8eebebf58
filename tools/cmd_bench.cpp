// `firsttoken bench peak`: this machine's fp32 FMA peak and memory read bandwidth, 1..N threads.
// `firsttoken bench model`: prefill (pp) and decode (tg) speed of a model, with the useful FLOP
// and byte counts of the run, as % of the peak and bandwidth measured in the same run.
// `bench serve` / `bench ablate`: tools/cmd_bench_serve.cpp.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <numeric>
#include <random>
#include <thread>

#include "core/ab_arm.h"
#include "core/error.h"
#include "kernels/kernels.h"
#include "engine/engine.h"
#include "kernels/peak.h"
#include "kv/kv_cache.h"
#include "model/lora.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"
#include "tools/commands.h"

namespace ft::tools {

namespace {

int default_threads(int t) {
  if (t > 0) return t;
  const unsigned hw = std::thread::hardware_concurrency();
  return hw ? int(hw) : 1;
}

uint64_t weight_bytes(const WeightView& w) { return *row_bytes(w.type, uint64_t(w.n_cols)) * uint64_t(w.n_rows); }
double matmul_flops(const WeightView& w, int64_t M) { return 2.0 * double(M) * double(w.n_rows) * double(w.n_cols); }

// Greedy generation of n_gen tokens through the engine (one request), with cfg's speculation.
struct GenRun {
  std::vector<int32_t> tokens;
  RequestTimings t;
  SpecTimes times;  // the engine's, for this one request
};
SpecTimes minus(const SpecTimes& a, const SpecTimes& b) {
  SpecTimes d;
  d.catch_up_ms = a.catch_up_ms - b.catch_up_ms;
  d.catch_up_forwards = a.catch_up_forwards - b.catch_up_forwards;
  d.catch_up_tokens = a.catch_up_tokens - b.catch_up_tokens;
  d.draft_forward_ms = a.draft_forward_ms - b.draft_forward_ms;
  d.draft_forwards = a.draft_forwards - b.draft_forwards;
  d.draft_other_ms = a.draft_other_ms - b.draft_other_ms;
  d.verify_forward_ms = a.verify_forward_ms - b.verify_forward_ms;
  d.verify_steps = a.verify_steps - b.verify_steps;
  d.plain_forward_ms = a.plain_forward_ms - b.plain_forward_ms;
  d.plain_steps = a.plain_steps - b.plain_steps;
  d.schedule_ms = a.schedule_ms - b.schedule_ms;
  d.sample_ms = a.sample_ms - b.sample_ms;
  d.emit_ms = a.emit_ms - b.emit_ms;
  return d;
}

// One request on a long-lived engine (as a server runs them: its buffers and the draft model's
// are warm after the first request).
GenRun generate(Engine& engine, const std::vector<int32_t>& prompt, int64_t n_gen) {
  auto settled = [&engine] {  // the metrics snapshot follows the step that finished a request
    const EngineCounters c = engine.metrics().counters;
    return c.finished + c.cancelled;
  };
  const uint64_t done0 = settled();
  const SpecTimes t0 = engine.metrics().counters.spec_times;
  EngineRequest r;
  r.prompt = prompt;
  r.max_tokens = n_gen;
  r.ignore_eos = true;
  r.sampling.temperature = 0;
  EventStream s;
  engine.submit(std::move(r), s.callback());
  GenRun out;
  EngineEvent ev;
  while (s.next(ev, &out.t))
    if (ev.kind == EngineEvent::Kind::Token) out.tokens.push_back(ev.token);
  for (int i = 0; i < 10000 && settled() <= done0; ++i) std::this_thread::sleep_for(std::chrono::microseconds(100));
  out.times = minus(engine.metrics().counters.spec_times, t0);
  return out;
}

// The one-time part of the draft model's prompt catch-up (ms): its catch-up forwards less the
// draft position each also computed (at the mean cost of a one-position draft forward).
double catch_up_excess_ms(const SpecTimes& t) {
  const double position = t.draft_forwards ? t.draft_forward_ms / double(t.draft_forwards) : 0;
  return std::max(0.0, t.catch_up_ms - double(t.catch_up_forwards) * position);
}

// Greedy decode tokens/s after the first token; catch_up: with the draft's one-time prompt
// catch-up in the time (false: without it, the "greedy decode tokens/s").
double decode_tps(const GenRun& g, bool catch_up = false) {
  const double ms = g.t.decode_ms() - (catch_up ? 0.0 : catch_up_excess_ms(g.times));
  return g.tokens.size() > 1 && ms > 0 ? double(g.tokens.size() - 1) / ms * 1e3 : 0;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Speculative decoding against plain decode: greedy generation, same prompt, reps pairs
// interleaved in one process (drift on a shared machine hits both; each pair's ratio and their
// median are printed), then where the speculating run's time went, then the verification cost:
// k + 1 positions of one sequence in one forward vs one decode position, at the prompt's context.
void bench_spec(const BenchArgs& a, const Model& model, int T) {
  const HParams& hp = model.hparams();
  const SpecConfig spec = spec_from_flags(a.spec);
  std::unique_ptr<Model> draft;
  std::vector<int32_t> prompt;
  if (!a.prompt.empty()) {
    prompt = Tokenizer::from_gguf(model.file()).encode(a.prompt, true, false);
  } else {
    std::mt19937 rng(7);
    for (int64_t i = 0; i < a.n_prompt; ++i) prompt.push_back(int32_t(rng() % uint32_t(hp.n_tokens)));
  }
  const int64_t n_ctx = int64_t(prompt.size()) + a.n_gen + kMaxSpecTokens + 1;
  EngineConfig base = single_request_config(model, n_ctx, std::max<int64_t>(int64_t(prompt.size()), 1), T,
                                            parse_kv_type(a.kv_type));
  EngineConfig with = base;
  with.spec = spec;
  if (spec.method == SpecMethod::Draft) {
    draft = load_draft_model(spec.draft_model, model, a.rope);
    with.draft_model = draft.get();
  }
  std::printf("speculative %s (k = %s%d): greedy decode %lld tokens, prompt %zu tokens, %d interleaved pairs "
              "(tokens/s after the first token; the draft's one-time prompt catch-up excluded, then included)\n",
              spec_method_name(spec.method), spec.k_auto ? "auto, at most " : "", spec.k, (long long)a.n_gen,
              prompt.size(), std::max(1, a.reps));
  Engine off_engine(model, base, {}), on_engine(model, with, {});
  generate(off_engine, prompt, std::min<int64_t>(a.n_gen, 8));  // warm-up: first touches, first calls
  generate(on_engine, prompt, std::min<int64_t>(a.n_gen, 8));
  std::vector<double> ratios, ratios_with, on_tps, off_tps, ttft_on, ttft_off;
  GenRun last_on;
  bool identical = true;
  for (int rep = 0; rep < std::max(1, a.reps); ++rep) {
    // Alternate which goes first: a drift within a pair does not favour one side.
    GenRun off, on;
    if (rep % 2 == 0) {
      off = generate(off_engine, prompt, a.n_gen);
      on = generate(on_engine, prompt, a.n_gen);
    } else {
      on = generate(on_engine, prompt, a.n_gen);
      off = generate(off_engine, prompt, a.n_gen);
    }
    identical &= on.tokens == off.tokens;
    const SpecStats& s = on.t.spec;
    const double rate = s.draft_tokens ? double(s.accepted_tokens) / double(s.draft_tokens) : 0;
    const double r = decode_tps(on) / std::max(decode_tps(off), 1e-9);
    const double rw = decode_tps(on, true) / std::max(decode_tps(off, true), 1e-9);
    std::printf("  pair %d: %.2f vs %.2f tokens/s = %.3fx (with catch-up %.3fx) | acceptance %.1f%% (%lld of %lld), "
                "%.2f tokens per verification | TTFT %.2f vs %.2f ms | catch-up %.2f ms (%lld tokens)\n",
                rep, decode_tps(on), decode_tps(off), r, rw, 100 * rate, (long long)s.accepted_tokens,
                (long long)s.draft_tokens, s.drafts ? 1.0 + double(s.accepted_tokens) / double(s.drafts) : 0.0,
                on.t.ttft_ms(), off.t.ttft_ms(), catch_up_excess_ms(on.times), (long long)on.times.catch_up_tokens);
    ratios.push_back(r);
    ratios_with.push_back(rw);
    on_tps.push_back(decode_tps(on));
    off_tps.push_back(decode_tps(off));
    ttft_on.push_back(on.t.ttft_ms());
    ttft_off.push_back(off.t.ttft_ms());
    last_on = std::move(on);
  }
  std::printf("speculative median: %.2f vs %.2f tokens/s, ratio %.3fx (with catch-up %.3fx), TTFT %.2f vs %.2f ms | "
              "output %s\n",
              median(on_tps), median(off_tps), median(ratios), median(ratios_with), median(ttft_on), median(ttft_off),
              identical ? "identical" : "DIFFERS");
  // Where the last speculating run's time went (ms; per call in brackets).
  const SpecTimes& t = last_on.times;
  const double total = last_on.t.finish_ms - last_on.t.first_scheduled_ms;
  auto per = [](double ms, int64_t n) { return n ? ms / double(n) : 0.0; };
  std::printf("speculative phases (last run, %.1f ms from its first step): draft catch-up %.2f (%lld forwards, %lld "
              "tokens) | draft forwards %.2f (%lld, %.3f each) | draft bookkeeping %.2f | verify forwards %.2f (%lld, "
              "%.3f each) | plain forwards %.2f (%lld, %.3f each) | schedule %.2f | sample+verify %.2f | emit %.2f | "
              "unaccounted %.2f\n",
              total, t.catch_up_ms, (long long)t.catch_up_forwards, (long long)t.catch_up_tokens, t.draft_forward_ms,
              (long long)t.draft_forwards, per(t.draft_forward_ms, t.draft_forwards), t.draft_other_ms,
              t.verify_forward_ms, (long long)t.verify_steps, per(t.verify_forward_ms, t.verify_steps),
              t.plain_forward_ms, (long long)t.plain_steps, per(t.plain_forward_ms, t.plain_steps), t.schedule_ms,
              t.sample_ms, t.emit_ms,
              total - (t.catch_up_ms + t.draft_forward_ms + t.draft_other_ms + t.verify_forward_ms +
                       t.plain_forward_ms + t.schedule_ms + t.sample_ms + t.emit_ms));

  // Verification cost at the prompt's context.
  auto be = make_backend(a.backend, T);
  const int32_t k = spec.k;
  Forward fwd(model, *be, k + 1);
  RuntimeConfig rt;
  rt.kv_type = parse_kv_type(a.kv_type);
  const int64_t ctx = int64_t(prompt.size());
  KVCache kv(kv_cache_config(rt, hp, KVCache::blocks_for(ctx + k + 1, rt.kv_block_size), false));
  if (!kv.reserve(0, ctx + k + 1)) fail("bench: KV cache too small");
  std::vector<float> logits(size_t(k + 1) * size_t(hp.n_vocab));
  Batch b;
  for (int64_t s0 = 0; s0 < ctx; s0 += k + 1) {  // the context's K/V (chunks of k + 1)
    b.clear();
    for (int64_t i = s0; i < std::min(ctx, s0 + k + 1); ++i) b.add(prompt[size_t(i)], int32_t(i), 0, false);
    b.want_logits.back() = 1;
    fwd.run(b, kv, logits.data());
  }
  auto time_positions = [&](int32_t n) {
    b.clear();
    for (int32_t i = 0; i < n; ++i) b.add(prompt[size_t(i) % prompt.size()], int32_t(ctx + i), 0, true);
    const auto t0 = std::chrono::steady_clock::now();
    fwd.run(b, kv, logits.data());
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  };
  // 1 and k + 1 positions alternate, the order swapped per pair, so a shared machine's drift
  // (its memory bandwidth moves 15-50% within minutes) hits both sides alike: the best of each,
  // and the median of the pairs' ratios.
  double t1 = 1e30, tk = 1e30;
  std::vector<double> pair_ratios;
  for (int rep = 0; rep < 10 * std::max(1, a.reps); ++rep) {
    const bool one_first = rep % 2 == 0;
    const double first = time_positions(one_first ? 1 : k + 1), second = time_positions(one_first ? k + 1 : 1);
    const double one = one_first ? first : second, many = one_first ? second : first;
    t1 = std::min(t1, one);
    tk = std::min(tk, many);
    pair_ratios.push_back(many / one);
  }
  std::printf("verification cost: %d positions %.2f ms vs 1 position %.2f ms = %.2fx (best of each), median of %zu "
              "alternated pairs %.2fx (context %lld)\n",
              k + 1, tk, t1, tk / t1, pair_ratios.size(), median(pair_ratios), (long long)ctx);
  if (!draft) return;
  // A draft model's one-position forward (median ms): back to back, and each after a target
  // forward (as in a verification cycle, whose target forward evicts the draft's weights).
  Forward dfwd(*draft, *be, std::max<int64_t>(ctx, k + 1));
  KVCache dkv(kv_cache_config(rt, draft->hparams(), KVCache::blocks_for(ctx + k + 1, rt.kv_block_size), false));
  if (!dkv.reserve(0, ctx + k + 1)) fail("bench: KV cache too small");
  Batch db;
  for (int64_t i = 0; i < ctx; ++i) db.add(prompt[size_t(i)], int32_t(i), 0, i + 1 == ctx);
  dfwd.run(db, dkv, logits.data());
  auto draft_ms = [&](bool after_target) {
    std::vector<double> v;
    for (int rep = 0; rep < 10 * std::max(1, a.reps); ++rep) {
      if (after_target) {
        b.clear();
        b.add(prompt[0], int32_t(ctx), 0, true);
        fwd.run(b, kv, logits.data());
      }
      db.clear();
      db.add(prompt[size_t(rep) % prompt.size()], int32_t(ctx), 0, true);
      const auto t0 = std::chrono::steady_clock::now();
      dfwd.run(db, dkv, logits.data());
      v.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    return median(v);
  };
  const double alone = draft_ms(false), after = draft_ms(true);
  std::printf("draft forward, 1 position: %.3f ms back to back, %.3f ms after a target forward (%.2f / %.2f of the "
              "target's 1 position)\n", alone, after, alone / t1, after / t1);
}

}  // namespace

void add_bench(CLI::App& app, BenchArgs& a) {
  CLI::App* c = app.add_subcommand("bench", "Machine peaks (peak), model speed (model), serving load (serve, ablate)");
  c->require_subcommand(1);
  CLI::App* peak = c->add_subcommand("peak", "fp32 FMA peak (GFLOP/s) and memory read bandwidth (GB/s), 1..N threads");
  peak->add_option("-t,--threads", a.threads, "Max threads (0 = all cores)")->capture_default_str();
  peak->callback([&a] { a.mode = "peak"; });
  CLI::App* model = c->add_subcommand("model", "Prefill and decode speed of a model vs the measured peaks");
  model->add_option("-m,--model", a.model, "GGUF model file")->required();
  model->add_option("-p,--n-prompt", a.n_prompt, "Prompt tokens (one prefill batch)")->capture_default_str();
  model->add_option("-n,--n-gen", a.n_gen, "Generated tokens (decode, one at a time)")->capture_default_str();
  model->add_option("-t,--threads", a.threads, "Threads (0 = all cores)")->capture_default_str();
  model->add_option("-r,--reps", a.reps, "Repetitions after a warm-up token (best is reported)")->capture_default_str();
  model->add_option("--backend", a.backend, "Backend: cpu or reference")->capture_default_str();
  model->add_option("--kv-type", a.kv_type, "KV cache element type: f16, bf16, q8_0 or f32")->capture_default_str();
  model->add_flag("--ab", a.ab,
                  "Alternate the A/B arm (core/ab_arm.h) between decode steps and print the arms' step times "
                  "(an experiment's B over A, measured in the same minutes; without one, an A/A control)");
  add_spec_flags(model, a.spec);
  add_rope_flags(model, a.rope);
  model->add_option("--prompt", a.prompt, "With --spec: a text prompt for the generation runs (default: -p random tokens)");
  model->callback([&a] { a.mode = "model"; });
  CLI::App* lora = c->add_subcommand("lora", "Decode speed with LoRA adapters vs the base: one sequence, and a batch mixing them");
  lora->add_option("-m,--model", a.model, "GGUF model file")->required();
  lora->add_option("--lora", a.lora, "Adapter GGUF (repeat: the mixed batch has one sequence per adapter)")->required();
  lora->add_option("-p,--n-prompt", a.n_prompt, "Prompt tokens per sequence")->capture_default_str();
  lora->add_option("-n,--n-gen", a.n_gen, "Decode steps timed")->capture_default_str();
  lora->add_option("-t,--threads", a.threads, "Threads (0 = all cores)")->capture_default_str();
  lora->add_option("-r,--reps", a.reps, "Repetitions (each: fresh prompts, then the steps; times summed)")->capture_default_str();
  lora->callback([&a] { a.mode = "lora"; });
  add_bench_serve(*c, a.serve, a.mode);
}

namespace {

// Sequences decoding together (one row each, under adapters[i]) after a prompt of n_prompt
// random tokens each: step() runs one timed decode step.
struct LoraDecode {
  Forward& fwd;
  std::vector<const LoraAdapter*> adapters;
  int64_t n_prompt, pos = 0;
  KVCache kv;
  std::vector<float> logits;
  std::mt19937 rng{7};
  std::uniform_int_distribution<int32_t> tok;
  Batch b;
  std::vector<double> step_sec;  // each timed step's time
  LoraDecode(Forward& f, const Model& m, std::vector<const LoraAdapter*> ads, int64_t n_prompt_, int64_t n_gen)
      : fwd(f),
        adapters(std::move(ads)),
        n_prompt(n_prompt_),
        kv(kv_cache_config(RuntimeConfig{}, m.hparams(),
                           int32_t(adapters.size()) * KVCache::blocks_for(n_prompt_ + n_gen + 1, RuntimeConfig{}.kv_block_size),
                           false)),
        logits(adapters.size() * size_t(m.hparams().n_vocab)),
        tok(3, m.hparams().n_tokens - 1) {
    for (int32_t s = 0; s < int32_t(adapters.size()); ++s) {
      if (!kv.reserve(s, n_prompt + n_gen + 1)) fail("bench lora: KV cache too small");
      for (int64_t c = 0; c < n_prompt; c += fwd.max_batch()) {
        b.clear();
        for (int64_t i = c; i < std::min(n_prompt, c + fwd.max_batch()); ++i)
          b.add(tok(rng), int32_t(i), s, i == n_prompt - 1, adapters[size_t(s)]);
        fwd.run(b, kv, logits.data());
      }
    }
  }
  void step() {
    b.clear();
    for (int32_t s = 0; s < int32_t(adapters.size()); ++s)
      b.add(tok(rng), int32_t(n_prompt + pos), s, true, adapters[size_t(s)]);
    const auto t0 = std::chrono::steady_clock::now();
    fwd.run(b, kv, logits.data());
    step_sec.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    ++pos;
  }
  double seconds() const { return std::accumulate(step_sec.begin(), step_sec.end(), 0.0); }
  int64_t tokens() const { return int64_t(step_sec.size() * adapters.size()); }
};

// Each case against its base, decode steps alternated one by one (base, adapted, base, ...)
// so that both see the same machine: the ratio is of the summed step times over every
// repetition (on a shared machine, whole runs of one case after the other moved the ratio by
// +-8% where this moves it by a few %), and the median over adjacent pairs of base step time
// over adapted step time: one preempted step (10-50 ms on this host, against ~1.5 ms steps)
// moves a sum by up to 30% and the median not at all.
int bench_lora(const BenchArgs& a, int T) {
  const auto model = Model::load(a.model);
  auto be = make_backend("cpu", T);
  std::vector<std::unique_ptr<LoraAdapter>> ads;
  for (const std::string& f : a.lora) {
    ads.push_back(LoraAdapter::load(f, *model));
    ads.back()->prepare(*be);
  }
  const int64_t S = int64_t(ads.size());
  Forward fwd(*model, *be, std::max<int64_t>(std::min<int64_t>(a.n_prompt, 512), S));
  fwd.enable_lora();
  std::vector<const LoraAdapter*> mixed;
  for (const auto& p : ads) mixed.push_back(p.get());
  const std::vector<const LoraAdapter*> cases[4] = {{nullptr}, {ads[0].get()}, std::vector<const LoraAdapter*>(size_t(S), nullptr), mixed};
  double sec[4] = {0, 0, 0, 0};
  int64_t tokens[4] = {0, 0, 0, 0};
  std::vector<double> pair_ratio[2];  // per case pair: base step / adapted step
  for (int r = 0; r < std::max(1, a.reps); ++r)
    for (int pair = 0; pair < 2; ++pair) {
      LoraDecode base(fwd, *model, cases[2 * pair], a.n_prompt, a.n_gen), lora(fwd, *model, cases[2 * pair + 1], a.n_prompt, a.n_gen);
      base.step(), lora.step();  // (warm-up, not counted)
      base.step_sec.clear(), lora.step_sec.clear();
      for (int64_t g = 1; g < a.n_gen; ++g) base.step(), lora.step();
      for (size_t g = 0; g < base.step_sec.size(); ++g) pair_ratio[pair].push_back(base.step_sec[g] / lora.step_sec[g]);
      sec[2 * pair] += base.seconds(), sec[2 * pair + 1] += lora.seconds();
      tokens[2 * pair] += base.tokens(), tokens[2 * pair + 1] += lora.tokens();
    }
  double tps[4];
  for (int i = 0; i < 4; ++i) tps[i] = double(tokens[i]) / sec[i];
  const double med[2] = {median(pair_ratio[0]), median(pair_ratio[1])};
  std::printf("model %s, %d thread(s), kernels %s, prompt %lld, %lld decode steps x %d, alternated with the base step by step\n",
              a.model.c_str(), T, std::string(cpu_isa()).c_str(), (long long)a.n_prompt, (long long)a.n_gen,
              std::max(1, a.reps));
  std::printf("adapter: rank %d, %d weights adapted (%s)\n", ads[0]->rank(), ads[0]->n_adapted(), a.lora[0].c_str());
  std::printf("%-40s %12s %8s %14s\n", "case", "tokens/s", "vs base", "median pair");
  std::printf("%-40s %12.1f %8s %14s\n", "base, 1 sequence", tps[0], "1.000", "1.000");
  std::printf("%-40s %12.1f %8.3f %14.3f   (cost %.1f%%, median %.1f%%)\n", "1 adapter, 1 sequence", tps[1],
              tps[1] / tps[0], med[0], 100 * (1 - tps[1] / tps[0]), 100 * (1 - med[0]));
  std::printf("%-40s %12.1f %8s %14s\n", cat("base, ", S, " sequences").c_str(), tps[2], "1.000", "1.000");
  std::printf("%-40s %12.1f %8.3f %14.3f   (cost %.1f%%, median %.1f%%)\n", cat(S, " sequences, ", S, " adapters").c_str(),
              tps[3], tps[3] / tps[2], med[1], 100 * (1 - tps[3] / tps[2]), 100 * (1 - med[1]));
  return 0;
}

}  // namespace

int cmd_bench(const BenchArgs& a) {
  if (a.mode == "serve") return cmd_bench_serve(a.serve);
  if (a.mode == "ablate") return cmd_bench_ablate(a.serve);
  check_flag("-t/--threads", a.threads, 0, server::kMaxThreads);
  if (a.mode == "model" || a.mode == "lora") {  // (one prefill batch of -p; a context of -p + -n)
    check_flag("-p/--n-prompt", a.n_prompt, 1, server::kMaxBatchTokens);
    check_flag("-n/--n-gen", a.n_gen, 0, server::kMaxContextLength);
  }
  const int T = default_threads(a.threads);
  if (a.mode == "lora") return bench_lora(a, T);
  if (a.mode == "peak") {
    // Every ceiling of every instruction set this CPU has, 1..T threads.
    std::printf("%-8s %-12s %16s %16s %16s %16s\n", "threads", "isa", "fp32 GFLOP/s", "bf16 GFLOP/s", "int8 GOP/s",
                "read GB/s");
    for (int t = 1; t <= T; ++t) {
      const double bw = measure_read_bandwidth_gbs(t);
      for (std::string_view isa : cpu_isas())
        std::printf("%-8d %-12s %16.1f %16.1f %16.1f %16.1f\n", t, std::string(isa).c_str(),
                    measure_fma_peak_gflops(t, 0.3, isa), measure_bf16_peak_gflops(t, 0.3, isa),
                    measure_int8_peak_gops(t, 0.3, isa), bw);
    }
    std::string names;
    for (std::string_view isa : cpu_isas()) names += std::string(names.empty() ? "" : "|") + std::string(isa);
    std::printf("isa: %s (kernels in use; FT_ISA=%s forces another)\n", std::string(cpu_isa()).c_str(),
                names.c_str());
    return 0;
  }
  using clock = std::chrono::steady_clock;
  const auto model = Model::load(a.model, a.rope);
  const HParams& hp = model->hparams();
  const ModelWeights& w = model->weights();
  if (a.n_prompt < 1 || a.n_gen < 0) fail("bench: -p must be >= 1 and -n >= 0");
  const int64_t n_ctx = a.n_prompt + a.n_gen;
  auto be = make_backend(a.backend, T);
  Forward fwd(*model, *be, a.n_prompt);
  RuntimeConfig rt;
  rt.kv_type = parse_kv_type(a.kv_type);
  KVCache kv(kv_cache_config(rt, hp, KVCache::blocks_for(n_ctx, rt.kv_block_size), false));
  std::vector<float> logits(size_t(hp.n_vocab));
  std::mt19937 rng(1);
  std::uniform_int_distribution<int32_t> tok(0, hp.n_vocab - 1);

  // Exact useful work. Per token through all layers: the matmul FLOPs (2 per weight) and
  // attention (QK^T and PV: 4 * n_ctx * head_dim per query head); the output projection for
  // the logit rows. Decode bytes: every weight read once per token, K/V rows read (and the
  // new row written), the embedding row.
  double layer_flops_per_tok = 0, int_flops_per_tok = 0, bf16_flops_per_tok = 0;
  double layer_bytes_per_tok = 0;
  auto count = [&](const WeightView& v, double share) {  // share: of the tokens that read it
    layer_flops_per_tok += share * matmul_flops(v, 1);
    if (is_int8_weight_type(v.type)) int_flops_per_tok += share * matmul_flops(v, 1);
    if (v.type == GGMLType::BF16) bf16_flops_per_tok += share * matmul_flops(v, 1);
    layer_bytes_per_tok += share * double(weight_bytes(v));
  };
  for (const LayerWeights& L : w.layers) {
    for (const WeightView* v : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down, &L.moe_router, &L.w_gate_shexp,
                                &L.w_up_shexp, &L.w_down_shexp})  // (qwen2moe's shared expert: every token's)
      if (v->data) count(*v, 1);
    // A mixture of experts: a token runs n_experts_used of them (a decode step reads as many).
    for (const LayerWeights::Expert& e : L.experts)
      for (const WeightView* v : {&e.gate, &e.up, &e.down}) count(*v, double(hp.n_experts_used) / hp.n_experts);
  }
  const uint64_t layer_bytes = uint64_t(layer_bytes_per_tok);
  // Prefill of a model whose matmuls are mostly quantized runs on int8 dot products: its
  // ceiling is the int8 peak; mostly BF16, on an instruction set with bf16 dot products, the
  // bf16 peak; else the fp32 FMA peak (of the instruction set in use).
  const std::string isa(a.backend == "cpu" ? cpu_isa() : "scalar");
  const bool int8_prefill = a.backend == "cpu" && int_flops_per_tok * 2 > layer_flops_per_tok;
  const bool bf16_prefill = a.backend == "cpu" && bf16_flops_per_tok * 2 > layer_flops_per_tok &&
                            measure_bf16_peak_gflops(1, 0.01, isa) > 0;
  const double attn_flops_per_pair = 4.0 * hp.head_dim * hp.n_heads;  // per (query, key) per layer
  const double out_flops = matmul_flops(w.output, 1);
  const uint64_t out_bytes = weight_bytes(w.output);
  const uint64_t embd_row = *row_bytes(w.token_embd.type, uint64_t(hp.dim));
  const double kv_row_bytes = double(KVCache::block_bytes(kv.config())) / kv.config().block_size;  // as stored

  // The ceilings are measured again around every repetition and the best kept: on a shared
  // machine one unlucky measurement would understate the ceiling and overstate our share of it.
  double peak = 0, bw = 0;
  auto measure_ceilings = [&] {
    const double p = int8_prefill   ? measure_int8_peak_gops(T, 0.3, isa)
                     : bf16_prefill ? measure_bf16_peak_gflops(T, 0.3, isa)
                                    : measure_fma_peak_gflops(T, 0.3, isa);
    peak = std::max(peak, p);
    bw = std::max(bw, measure_read_bandwidth_gbs(T));
  };
  measure_ceilings();

  double best_pp = 1e30, best_tg = 1e30;
  double ab_sec[2] = {0, 0};  // --ab: decode seconds and steps per arm, over every repetition
  int64_t ab_steps[2] = {0, 0};
  Batch b;
  // Warm-up: one token touches every weight once (maps the file's pages, fills the TLB).
  if (!kv.reserve(0, n_ctx)) fail("bench: KV cache too small");
  b.add(tok(rng), 0, 0, true);
  fwd.run(b, kv, logits.data());
  for (int rep = 0; rep < std::max(1, a.reps); ++rep) {
    kv.release(0);
    if (!kv.reserve(0, n_ctx)) fail("bench: KV cache too small");
    b.clear();
    for (int64_t i = 0; i < a.n_prompt; ++i) b.add(tok(rng), int32_t(i), 0, i + 1 == a.n_prompt);
    const auto t0 = clock::now();
    fwd.run(b, kv, logits.data());
    best_pp = std::min(best_pp, std::chrono::duration<double>(clock::now() - t0).count());
    const auto t1 = clock::now();
    for (int64_t i = 0; i < a.n_gen; ++i) {
      b.clear();
      b.add(tok(rng), int32_t(a.n_prompt + i), 0, true);
      const int arm = a.ab ? ab_arm_of(i, rep) : 0;
      g_ab_arm.store(arm, std::memory_order_relaxed);
      const auto s0 = clock::now();
      fwd.run(b, kv, logits.data());
      ab_sec[arm] += std::chrono::duration<double>(clock::now() - s0).count();
      ++ab_steps[arm];
    }
    g_ab_arm.store(0, std::memory_order_relaxed);
    best_tg = std::min(best_tg, std::chrono::duration<double>(clock::now() - t1).count());
    measure_ceilings();
  }
  const double P = double(a.n_prompt);
  // (query, key) pairs of the prefill: P (P + 1) / 2 per layer, fewer through a sliding window.
  double attn_pairs = 0;
  for (int32_t il = 0; il < hp.n_layers; ++il) {
    const double win = hp.layer_window(il);
    attn_pairs += win <= 0 || win >= P ? P * (P + 1) / 2 : win * (win + 1) / 2 + (P - win) * win;
  }
  const double pp_flops = layer_flops_per_tok * P + attn_flops_per_pair * attn_pairs + out_flops;
  double tg_bytes = 0;
  for (int64_t i = 0; i < a.n_gen; ++i)
    tg_bytes += double(layer_bytes + out_bytes + embd_row) + kv_row_bytes * double(a.n_prompt + i + 1);
  const double pp_gflops = pp_flops / best_pp / 1e9;
  const double tg_gbs = a.n_gen > 0 ? tg_bytes / best_tg / 1e9 : 0;
  std::printf("model: %s (%s), %d threads, backend %s (%s), KV cache %s (%.0f bytes per position)\n", a.model.c_str(),
              hp.name.c_str(), T, a.backend.c_str(), isa.c_str(), std::string(kv_type_name(kv.config().type)).c_str(),
              kv_row_bytes);
  std::printf("machine: %s peak %.1f G%s/s (%s), read bandwidth %.1f GB/s\n",
              int8_prefill ? "int8 dot-product" : bf16_prefill ? "bf16 dot-product" : "fp32 FMA", peak,
              int8_prefill ? "OP" : "FLOP",
              isa.c_str(), bw);
  std::printf("prefill pp%lld: %.2f tokens/s, %.1f GFLOP/s = %.1f%% of peak (%.3f s)\n",
              (long long)a.n_prompt, P / best_pp, pp_gflops, 100 * pp_gflops / peak, best_pp);
  if (a.n_gen > 0)
    std::printf("decode tg%lld: %.2f tokens/s, %.2f GB/s = %.1f%% of bandwidth (%.3f s)\n",
                (long long)a.n_gen, double(a.n_gen) / best_tg, tg_gbs, 100 * tg_gbs / bw, best_tg);
  std::printf("| %s | %.1f | %.1f%% | %.2f | %.1f%% |\n", hp.name.c_str(), P / best_pp,
              100 * pp_gflops / peak, a.n_gen > 0 ? double(a.n_gen) / best_tg : 0.0,
              100 * tg_gbs / bw);
  if (a.ab && ab_steps[0] > 0 && ab_steps[1] > 0) {
    const double ms_a = 1e3 * ab_sec[0] / double(ab_steps[0]), ms_b = 1e3 * ab_sec[1] / double(ab_steps[1]);
    std::printf("decode A/B: B/A %.4f (A %.3f ms/step over %lld steps, B %.3f ms/step over %lld)\n", ms_b / ms_a,
                ms_a, (long long)ab_steps[0], ms_b, (long long)ab_steps[1]);
  }
  if (spec_from_flags(a.spec).enabled()) bench_spec(a, *model, T);
  return 0;
}

}  // namespace ft::tools
