// LoRA adapters through the serving engine: the base and 4 adapters served at once give each
// request what it gives alone; a fifth adapter beyond max_active_adapters waits for a slot and is
// not starved; the prefix cache never shares blocks across adapters; loading and unloading
// behave as documented (engine.h).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>

#include "core/error.h"
#include "engine/engine.h"
#include "model/lora.h"
#include "model/synthetic.h"
#include "test_util.h"

namespace ft {
namespace {

using test::TempFile;

struct Fixture {
  TempFile base{"elora_base.gguf"};
  std::vector<std::unique_ptr<TempFile>> adapters;
  std::unique_ptr<Model> model;
  explicit Fixture(int n_adapters) {
    write_synthetic_model(SyntheticOptions{}, base.path());
    for (int k = 0; k < n_adapters; ++k) {
      adapters.push_back(std::make_unique<TempFile>("elora_" + std::to_string(k) + ".gguf"));
      SyntheticLoraOptions lo;
      lo.seed = uint64_t(k + 1);
      write_synthetic_lora(base.path(), lo, adapters.back()->path());
    }
    model = Model::load(base.path());
  }
};

EngineConfig config(int32_t max_adapters, bool prefix_caching = false) {
  EngineConfig c;
  c.runtime.threads = 2;
  c.scheduler.chunk_size = 16;
  c.scheduler.max_active_adapters = max_adapters;
  c.prefix_caching = prefix_caching;
  c.calibrate = false;
  return c;
}

std::vector<int32_t> prompt(int n, int salt) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back(3 + (i * 41 + salt * 13) % 250);
  return p;
}

struct LoraOutcome {
  std::vector<int32_t> tokens;
  RequestTimings t;
  FinishReason reason = FinishReason::Stop;
  std::string error;
};

EngineRequest request(const std::vector<int32_t>& p, std::shared_ptr<const LoraAdapter> a, int64_t n = 12) {
  EngineRequest r;
  r.prompt = p;
  r.max_tokens = n;
  r.ignore_eos = true;
  r.sampling.temperature = 0;
  r.adapter = std::move(a);
  return r;
}

LoraOutcome drain(EventStream& s) {
  LoraOutcome o;
  EngineEvent ev;
  while (s.next(ev, &o.t)) {
    if (ev.kind == EngineEvent::Kind::Token) o.tokens.push_back(ev.token);
    else { o.reason = ev.reason; o.error = ev.error; }
  }
  return o;
}

LoraOutcome alone(Engine& e, const std::vector<int32_t>& p, std::shared_ptr<const LoraAdapter> a) {
  EventStream s;
  e.submit(request(p, std::move(a)), s.callback());
  return drain(s);
}

TEST(EngineLora, BaseAndFourAdaptersTogetherGiveWhatEachGivesAlone) {
  Fixture f(4);
  Engine e(*f.model, config(4), nullptr);
  std::vector<std::shared_ptr<const LoraAdapter>> ads = {nullptr};
  for (size_t k = 0; k < f.adapters.size(); ++k) ads.push_back(e.load_adapter("a" + std::to_string(k), f.adapters[k]->path()));
  std::vector<std::vector<int32_t>> prompts;
  for (size_t i = 0; i < ads.size(); ++i) prompts.push_back(prompt(10 + 7 * int(i), int(i)));
  std::vector<LoraOutcome> solo;
  for (size_t i = 0; i < ads.size(); ++i) solo.push_back(alone(e, prompts[i], ads[i]));
  std::vector<EventStream> s(ads.size());
  for (size_t i = 0; i < ads.size(); ++i) e.submit(request(prompts[i], ads[i]), s[i].callback());
  for (size_t i = 0; i < ads.size(); ++i) {
    const LoraOutcome o = drain(s[i]);
    EXPECT_EQ(o.tokens, solo[i].tokens) << "request " << i;
    EXPECT_EQ(o.reason, FinishReason::Length) << o.error;
  }
  // Each adapter's output is its own.
  for (size_t i = 1; i < ads.size(); ++i) EXPECT_NE(solo[i].tokens, solo[0].tokens) << "adapter " << i;
}

TEST(EngineLora, AFifthAdapterWaitsForASlotAndIsNotStarved) {
  Fixture f(5);
  Engine e(*f.model, config(4), nullptr);
  std::vector<std::shared_ptr<const LoraAdapter>> ads;
  for (size_t k = 0; k < f.adapters.size(); ++k) ads.push_back(e.load_adapter("a" + std::to_string(k), f.adapters[k]->path()));
  const LoraOutcome solo5 = alone(e, prompt(8, 9), ads[4]);
  // Adapters 0-3 busy with long requests, then the fifth's, then more of 0-3 arriving after it.
  std::vector<EventStream> first(4), later(4);
  EventStream fifth;
  for (int k = 0; k < 4; ++k) e.submit(request(prompt(8, k), ads[size_t(k)], 40), first[size_t(k)].callback());
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  e.submit(request(prompt(8, 9), ads[4]), fifth.callback());
  for (int k = 0; k < 4; ++k) e.submit(request(prompt(8, 20 + k), ads[size_t(k)], 40), later[size_t(k)].callback());
  std::vector<LoraOutcome> a, b;
  for (auto& s : first) a.push_back(drain(s));
  const LoraOutcome o5 = drain(fifth);
  for (auto& s : later) b.push_back(drain(s));
  EXPECT_EQ(o5.tokens, solo5.tokens);
  // Not starved: none of the requests of 0-3 that arrived after it started before it (their
  // adapters were running, so without the scheduler's rule they would have gone at once, and
  // kept its slot taken).
  for (const LoraOutcome& o : b) EXPECT_LE(o5.t.first_scheduled_ms, o.t.first_scheduled_ms);
  // ... and it waited for a slot: not scheduled before one of the first four finished.
  double first_finish = 1e300;
  for (const LoraOutcome& o : a) first_finish = std::min(first_finish, o.t.finish_ms);
  EXPECT_GE(o5.t.first_scheduled_ms, first_finish);
}

TEST(EngineLora, PrefixCacheIsKeyedByAdapter) {
  Fixture f(2);
  Engine e(*f.model, config(4, /*prefix_caching=*/true), nullptr);
  const auto a0 = e.load_adapter("a0", f.adapters[0]->path());
  const auto a1 = e.load_adapter("a1", f.adapters[1]->path());
  const std::vector<int32_t> p = prompt(40, 3);
  const LoraOutcome base1 = alone(e, p, nullptr);
  EXPECT_EQ(base1.t.cached_tokens, 0);
  const LoraOutcome x0 = alone(e, p, a0);  // the base's blocks are not the adapter's
  EXPECT_EQ(x0.t.cached_tokens, 0);
  const LoraOutcome x1 = alone(e, p, a1);  // nor another adapter's
  EXPECT_EQ(x1.t.cached_tokens, 0);
  const LoraOutcome y0 = alone(e, p, a0);  // its own are
  EXPECT_GE(y0.t.cached_tokens, 32);
  EXPECT_EQ(y0.tokens, x0.tokens);
  const LoraOutcome base2 = alone(e, p, nullptr);
  EXPECT_GE(base2.t.cached_tokens, 32);
  EXPECT_EQ(base2.tokens, base1.tokens);
}

TEST(EngineLora, LoadAndUnload) {
  Fixture f(1);
  {
    Engine off(*f.model, config(0), nullptr);
    try {
      off.load_adapter("a", f.adapters[0]->path());
      ADD_FAILURE() << "loaded with max_active_adapters 0";
    } catch (const Error& err) {
      EXPECT_NE(std::string(err.what()).find("adapters are off"), std::string::npos) << err.what();
    }
  }
  Engine e(*f.model, config(4), nullptr);
  EXPECT_THROW(e.load_adapter("a", f.base.path()), Error);  // a model, not an adapter
  EXPECT_EQ(e.find_adapter("a"), nullptr);
  auto a = e.load_adapter("a", f.adapters[0]->path());
  EXPECT_THROW(e.load_adapter("a", f.adapters[0]->path()), Error);  // the name is taken
  EXPECT_THROW(e.unload_adapter("nope"), AdapterNotFound);
  // In use by a request (ours holds a reference too): refused, saying so.
  EventStream s;
  e.submit(request(prompt(8, 1), a, 30), s.callback());
  try {
    e.unload_adapter("a", std::chrono::milliseconds(50));
    ADD_FAILURE() << "unloaded an adapter in use";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("is in use by"), std::string::npos) << err.what();
  }
  // Users that let it go within the grace (a request a server answered at a stop string holds it
  // until the engine's next step): the unload waits for them.
  std::thread release([&] {
    drain(s);
    a.reset();
  });
  EXPECT_NO_THROW(e.unload_adapter("a", std::chrono::seconds(60)));
  release.join();
  EXPECT_EQ(e.find_adapter("a"), nullptr);
  EXPECT_TRUE(e.adapter_files().empty());
  // Loaded again (a new uid; its packed copies made afresh), it serves as before.
  a = e.load_adapter("a", f.adapters[0]->path());
  const LoraOutcome o = alone(e, prompt(8, 1), a);
  EXPECT_EQ(o.tokens.size(), 12u);
  // At most max_loaded_adapters loaded (one file under many names would pack a copy each): one
  // more is refused, a replacement is not one more, and an unload makes room.
  EngineConfig two = config(4);
  two.scheduler.max_loaded_adapters = 2;
  Engine capped(*f.model, two, nullptr);
  capped.load_adapter("x", f.adapters[0]->path());
  capped.load_adapter("y", f.adapters[0]->path());
  try {
    capped.load_adapter("z", f.adapters[0]->path());
    ADD_FAILURE() << "loaded a third adapter with max_loaded_adapters 2";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("max_loaded_adapters"), std::string::npos) << err.what();
  }
  EXPECT_NO_THROW(capped.load_adapter("y", f.adapters[0]->path(), /*replace=*/true));
  capped.unload_adapter("x");
  EXPECT_NO_THROW(capped.load_adapter("z", f.adapters[0]->path()));
  // A replacement of one still held is one more while it is held (each in-place load under a
  // stream kept a packed copy: 40 loads, 40 copies).
  std::shared_ptr<const LoraAdapter> held = capped.find_adapter("y");
  EXPECT_THROW(capped.load_adapter("y", f.adapters[0]->path(), /*replace=*/true), Error);
  capped.unload_adapter("z");
  EXPECT_NO_THROW(capped.load_adapter("y", f.adapters[0]->path(), /*replace=*/true));  // the old y is held: 2 resident
  try {
    capped.load_adapter("z", f.adapters[0]->path());
    ADD_FAILURE() << "a third adapter while a replaced one is held";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("max_loaded_adapters"), std::string::npos) << err.what();
  }
  held.reset();
  EXPECT_NO_THROW(capped.load_adapter("z", f.adapters[0]->path()));
}

// load_inplace: a name loaded again with replace takes the new file's weights (its greedy tokens
// are those of the same file loaded under another name, also for a prompt whose blocks the old
// adapter left in the prefix cache); a request that holds the old adapter finishes with it; without
// replace the name stays taken.
TEST(EngineLora, ReplaceInPlace) {
  Fixture f(2);
  Engine e(*f.model, config(4, /*prefix_caching=*/true), nullptr);
  const auto old_a = e.load_adapter("a", f.adapters[0]->path());
  const auto b = e.load_adapter("b", f.adapters[1]->path());
  const std::vector<int32_t> p = prompt(40, 5);
  const LoraOutcome under_old = alone(e, p, old_a);
  const LoraOutcome under_b = alone(e, p, b);
  ASSERT_NE(under_old.tokens, under_b.tokens) << "the two adapters agree: the test cannot tell them apart";
  EXPECT_THROW(e.load_adapter("a", f.adapters[1]->path()), Error);
  EventStream ref_s;  // what the old adapter writes for the request below
  e.submit(request(prompt(8, 2), old_a, 200), ref_s.callback());
  const LoraOutcome ref = drain(ref_s);
  EventStream held;  // a request of the old adapter, running while it is replaced
  e.submit(request(prompt(8, 2), old_a, 200), held.callback());
  const auto new_a = e.load_adapter("a", f.adapters[1]->path(), /*replace=*/true);
  EXPECT_NE(new_a, old_a);
  EXPECT_EQ(e.find_adapter("a"), new_a);
  const LoraOutcome o = drain(held);
  EXPECT_EQ(o.reason, FinishReason::Length) << o.error;
  EXPECT_EQ(o.tokens, ref.tokens);  // (the old adapter's to its end)
  const LoraOutcome under_new = alone(e, p, e.find_adapter("a"));
  EXPECT_EQ(under_new.tokens, under_b.tokens);
  EXPECT_EQ(under_new.t.cached_tokens, 0);  // (not the old adapter's blocks)
  EXPECT_EQ(e.adapter_files().size(), 2u);
  // A new name with replace is a plain load.
  EXPECT_NE(e.load_adapter("c", f.adapters[0]->path(), /*replace=*/true), nullptr);
}

// A load while a stream runs, packed a matrix per step (adapter_pack_slice_ms 0: the task
// re-queued after every step): the stream writes what it writes alone, and the adapter what the
// same file loaded on the idle engine writes.
TEST(EngineLora, PackedBetweenTheStepsOfAStream) {
  Fixture f(1);
  EngineConfig c = config(4);
  c.adapter_pack_slice_ms = 0;
  Engine e(*f.model, c, nullptr);
  const LoraOutcome alone_base = alone(e, prompt(8, 4), nullptr);
  EventStream s;
  e.submit(request(prompt(8, 4), nullptr, 12), s.callback());
  const auto a = e.load_adapter("a", f.adapters[0]->path());
  EXPECT_EQ(drain(s).tokens, alone_base.tokens);
  auto b = e.load_adapter("b", f.adapters[0]->path());  // (the engine idle: slices back to back)
  const LoraOutcome via_a = alone(e, prompt(8, 5), a), via_b = alone(e, prompt(8, 5), b);
  EXPECT_EQ(via_a.tokens, via_b.tokens);
  EXPECT_NE(via_a.tokens, alone(e, prompt(8, 5), nullptr).tokens) << "the adapter changes nothing";
  // Unloaded at once: its finished load's task holds no reference.
  b.reset();
  EXPECT_NO_THROW(e.unload_adapter("b"));
}

// Shutting the engine down while a load packs between its steps: the load ends at once, done or
// refused ("shutting down"), never waiting on a stopped engine.
TEST(EngineLora, ShutdownDuringALoadEndsIt) {
  Fixture f(1);
  EngineConfig c = config(4);
  c.adapter_pack_slice_ms = 0;
  Engine e(*f.model, c, nullptr);
  EventStream s;
  e.submit(request(prompt(8, 1), nullptr, 2000), s.callback());
  std::string outcome;
  std::thread loader([&] {
    try {
      e.load_adapter("a", f.adapters[0]->path());
      outcome = "loaded";
    } catch (const Error& err) {
      outcome = err.what();
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  e.shutdown();
  loader.join();
  EXPECT_TRUE(outcome == "loaded" || outcome.find("shutting down") != std::string::npos) << outcome;
  drain(s);
}

// An engine destroyed (not shut down first) while another thread's load is under way: the
// destructor's shutdown ends the load's wait, and the destructor returns only once that call has
// left the engine (it still uses its members on the way out), so nothing is used after it is
// freed (ASan, TSan) and nothing hangs. Destroyed from 0 ms (the load still mapping its file)
// to 5 ms after the call is under way.
TEST(EngineLora, DestroyedDuringALoadWaitsForIt) {
  Fixture f(1);
  EngineConfig c = config(4);
  c.adapter_pack_slice_ms = 0;
  for (int delay_ms : {0, 1, 2, 5}) {
    SCOPED_TRACE(delay_ms);
    auto e = std::make_unique<Engine>(*f.model, c, nullptr);
    EventStream s;
    e->submit(request(prompt(8, 1), nullptr, 2000), s.callback());
    std::string outcome;
    std::atomic<bool> returned{false};
    std::thread loader([&, eng = e.get()] {
      try {
        eng->load_adapter("a", f.adapters[0]->path());
        outcome = "loaded";
      } catch (const Error& err) {
        outcome = err.what();
      }
      returned = true;
    });
    while (e->adapter_loads_in_flight() == 0 && !returned) std::this_thread::yield();
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    e.reset();
    loader.join();
    EXPECT_TRUE(outcome == "loaded" || outcome.find("shutting down") != std::string::npos) << outcome;
    drain(s);
  }
}

}  // namespace
}  // namespace ft
