#include "server/response_store.h"

#include <algorithm>
#include <string_view>
#include <tuple>
#include <unordered_set>

namespace ft::server {

using json = nlohmann::json;

void EventLog::append(std::string event) {
  const std::lock_guard lock(mu_);
  bytes_ += event.size();
  events_.push_back(std::move(event));
}

void EventLog::publish(bool done) {
  const std::lock_guard lock(mu_);
  if (done_) return;
  const size_t from = published_;
  published_ = events_.size();
  done_ = done;
  std::erase_if(followers_, [](const Follow& x) { return x.owner.expired(); });
  for (Follow& x : followers_) {  // (each posts to its connection: quick)
    std::string text;
    for (size_t i = std::max(from, x.next); i < published_; ++i) text += events_[i];
    x.next = std::max(x.next, published_);
    if (!text.empty() || done) x.f(text, done);
  }
  if (done) followers_.clear();
}

std::pair<std::string, bool> EventLog::follow(int64_t after, std::weak_ptr<void> owner, Follower f) {
  const std::lock_guard lock(mu_);
  std::erase_if(followers_, [](const Follow& x) { return x.owner.expired(); });
  const uint64_t want = after < 0 ? 0 : uint64_t(after) + 1;  // (the first event it wants)
  std::string text;
  for (size_t i = size_t(std::min<uint64_t>(want, published_)); i < published_; ++i) text += events_[i];
  if (!done_) followers_.push_back({std::move(owner), std::move(f), size_t(std::max<uint64_t>(want, published_))});
  return {std::move(text), done_};
}

size_t EventLog::followers() const {
  const std::lock_guard lock(mu_);
  return followers_.size();
}

uint64_t EventLog::bytes() const {
  const std::lock_guard lock(mu_);
  return bytes_;
}

uint64_t ResponseStore::Entry::bytes() const {
  uint64_t n = kEntryOverhead + id.size() + previous_id.size() + response.size() + (events ? events->bytes() : 0);
  for (const auto* items : {&input, &output})
    for (const Item& it : *items) n += item_bytes(it);
  return n;
}

bool ResponseStore::put(Entry e) {
  const uint64_t b = e.bytes();
  if (max_responses_ <= 0 || b > max_bytes_) return false;
  auto entry = std::make_shared<const Entry>(std::move(e));
  const std::lock_guard lock(mu_);
  if (entries_.count(entry->id)) return false;
  insert(std::move(entry), b);
  return true;
}

bool ResponseStore::replace(Entry e, bool only_pending) {
  const uint64_t b = e.bytes();
  if (b > max_bytes_) return false;
  auto entry = std::make_shared<const Entry>(std::move(e));
  const std::lock_guard lock(mu_);
  const auto it = entries_.find(entry->id);
  if (it == entries_.end() || (only_pending && !it->second.entry->pending)) return false;
  drop(it);
  insert(std::move(entry), b);
  return true;
}

void ResponseStore::recount(const std::string& id) {
  const std::lock_guard lock(mu_);
  const auto it = entries_.find(id);
  if (it == entries_.end()) return;
  const uint64_t b = it->second.entry->bytes();
  bytes_ = bytes_ - it->second.bytes + b;
  it->second.bytes = b;
  while (bytes_ > max_bytes_ && order_.front() != id) drop(entries_.find(order_.front()));
}

void ResponseStore::insert(std::shared_ptr<const Entry> entry, uint64_t b) {
  while (!order_.empty() && (int64_t(entries_.size()) >= max_responses_ || bytes_ + b > max_bytes_))
    drop(entries_.find(order_.front()));
  order_.push_back(entry->id);
  for (const auto* items : {&entry->input, &entry->output})
    for (const Item& it : *items) items_.emplace(it.id, std::pair{puts_, entry.get()});
  ++puts_;
  bytes_ += b;
  std::string id = entry->id;  // (not entry->id beside std::move(entry): their order is unspecified)
  entries_.emplace(std::move(id), Slot{std::move(entry), b, std::prev(order_.end())});
}

void ResponseStore::drop(std::unordered_map<std::string, Slot>::iterator it) {
  const Entry* e = it->second.entry.get();
  for (const auto* items : {&e->input, &e->output})
    for (const Item& item : *items) {
      auto [lo, hi] = items_.equal_range(item.id);
      for (auto at = lo; at != hi; ++at)
        if (at->second.second == e) {
          items_.erase(at);
          break;
        }
    }
  bytes_ -= it->second.bytes;
  order_.erase(it->second.order);
  entries_.erase(it);
}

std::shared_ptr<const ResponseStore::Entry> ResponseStore::get(const std::string& id) const {
  const std::lock_guard lock(mu_);
  const auto it = entries_.find(id);
  return it == entries_.end() ? nullptr : it->second.entry;
}

bool ResponseStore::erase(const std::string& id) {
  const std::lock_guard lock(mu_);
  const auto it = entries_.find(id);
  if (it == entries_.end()) return false;
  drop(it);
  return true;
}

std::optional<std::string> ResponseStore::item(const std::string& id) const {
  const std::lock_guard lock(mu_);
  const Entry* latest = nullptr;
  uint64_t seq = 0;
  for (auto [at, end] = items_.equal_range(id); at != end; ++at)
    if (!latest || at->second.first > seq) std::tie(seq, latest) = at->second;
  if (!latest) return std::nullopt;
  for (const auto* items : {&latest->input, &latest->output})
    for (const Item& item : *items)
      if (item.id == id) return item.json;
  return std::nullopt;  // (not reached: an index entry names an entry holding the item)
}

ResponseStore::Chain ResponseStore::chain(const std::string& id) const {
  Chain c;
  {
    const std::lock_guard lock(mu_);
    // (ids are never reused and a response links only to one stored before it: no cycle; the
    // bound is belt and braces)
    for (std::string at = id; !at.empty() && c.links.size() <= entries_.size();) {
      const auto it = entries_.find(at);
      if (it == entries_.end()) {
        c.missing = at;
        break;
      }
      c.links.push_back(it->second.entry);
      at = it->second.entry->previous_id;
    }
  }
  std::reverse(c.links.begin(), c.links.end());
  return c;
}

std::vector<const ResponseStore::Item*> ResponseStore::items(const Chain& c, bool last_output) {
  std::vector<const Item*> out;
  for (size_t i = 0; i < c.links.size(); ++i) {
    for (const Item& it : c.links[i]->input) out.push_back(&it);
    if (i + 1 < c.links.size() || last_output)
      for (const Item& it : c.links[i]->output) out.push_back(&it);
  }
  return out;
}

std::vector<json> ResponseStore::conversation(const Chain& c, bool last_output) { return parse(items(c, last_output)); }

std::vector<json> ResponseStore::parse(const std::vector<const Item*>& items) {
  std::vector<json> out;
  out.reserve(items.size());
  for (const Item* it : items) out.push_back(json::parse(it->json));
  return out;
}

std::vector<ResponseStore::Item> ResponseStore::to_items(const json& items) {
  std::vector<Item> out;
  out.reserve(items.size());
  for (const json& it : items) out.push_back({it["id"].get<std::string>(), text(it)});
  return out;
}

uint64_t ResponseStore::text_bytes(const std::vector<const Item*>& items) {
  uint64_t n = 0;
  for (const Item* it : items) n += it->json.size();
  return n;
}

json ResponseStore::object(const Entry& e) {
  json r = json::parse(e.response);
  json output = json::array();
  for (const Item& it : e.output) output.push_back(json::parse(it.json));
  r["output"] = std::move(output);
  return r;
}

std::string ResponseStore::text(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

int64_t ResponseStore::size() const {
  const std::lock_guard lock(mu_);
  return int64_t(entries_.size());
}

uint64_t ResponseStore::bytes() const {
  const std::lock_guard lock(mu_);
  return bytes_;
}

uint64_t ConversationStore::Conversation::bytes() const {
  uint64_t n = ResponseStore::kEntryOverhead + id.size() + metadata.size();
  for (const auto& it : items) n += ResponseStore::item_bytes(*it);
  return n;
}

bool ConversationStore::put(Conversation c) {
  const uint64_t b = c.bytes();
  if (max_conversations_ <= 0 || b > max_conversation_bytes()) return false;
  const std::lock_guard lock(mu_);
  if (slots_.count(c.id)) return false;
  make_room(b, true, nullptr);
  order_.push_back(c.id);
  bytes_ += b;
  std::string id = c.id;  // (not c.id beside std::move(c): their order is unspecified)
  Slot& s = slots_.emplace(std::move(id), Slot{std::move(c), b, std::prev(order_.end()), {}, false}).first->second;
  for (const auto& x : s.c.items) s.ids.insert(x->id);
  return true;
}

void ConversationStore::make_room(uint64_t more, bool new_one, const std::string* keep) {
  // (bytes_ and more are each at most max_bytes_, at most 2^40: their sum does not overflow)
  for (auto at = order_.begin(); at != order_.end() &&
                                 (bytes_ + more > max_bytes_ || (new_one && int64_t(slots_.size()) >= max_conversations_));) {
    if (keep && *at == *keep) {
      ++at;
      continue;
    }
    const auto it = slots_.find(*at);
    bytes_ -= it->second.bytes;
    slots_.erase(it);
    at = order_.erase(at);
  }
}

bool ConversationStore::resize(Slot& s, uint64_t bytes) {
  if (bytes > max_conversation_bytes()) return false;
  if (bytes > s.bytes) make_room(bytes - s.bytes, false, &s.c.id);
  bytes_ = bytes_ - s.bytes + bytes;
  s.bytes = bytes;
  order_.splice(order_.end(), order_, s.order);
  return true;
}

std::optional<ConversationStore::Conversation> ConversationStore::get(const std::string& id) const {
  const std::lock_guard lock(mu_);
  const auto it = slots_.find(id);
  if (it == slots_.end()) return std::nullopt;
  return it->second.c;
}

bool ConversationStore::erase(const std::string& id) {
  const std::lock_guard lock(mu_);
  const auto it = slots_.find(id);
  if (it == slots_.end()) return false;
  bytes_ -= it->second.bytes;
  order_.erase(it->second.order);
  slots_.erase(it);
  return true;
}

ConversationStore::Change ConversationStore::add(const std::string& id, const std::vector<Item>& items,
                                                 std::string* duplicate) {
  const std::lock_guard lock(mu_);
  const auto it = slots_.find(id);
  if (it == slots_.end()) return Change::kNoConversation;
  Slot& s = it->second;
  std::unordered_set<std::string_view> fresh;  // (the new among themselves)
  uint64_t bytes = s.bytes;  // (each item at most a body's size, their count a body's: no overflow)
  for (const Item& x : items) {
    if (s.ids.count(x.id) || !fresh.insert(x.id).second) {
      if (duplicate) *duplicate = x.id;
      return Change::kDuplicate;
    }
    bytes += ResponseStore::item_bytes(x);
  }
  if (!resize(s, bytes)) return Change::kOverTheCap;
  for (const Item& x : items) {
    s.c.items.push_back(std::make_shared<const Item>(x));
    s.ids.insert(s.c.items.back()->id);
  }
  return Change::kDone;
}

ConversationStore::Change ConversationStore::erase_item(const std::string& id, const std::string& item_id, json* object) {
  const std::lock_guard lock(mu_);
  const auto it = slots_.find(id);
  if (it == slots_.end()) return Change::kNoConversation;
  Slot& s = it->second;
  if (!s.ids.count(item_id)) return Change::kNoItem;
  const auto at = std::find_if(s.c.items.begin(), s.c.items.end(), [&](const auto& x) { return x->id == item_id; });
  resize(s, s.bytes - ResponseStore::item_bytes(**at));  // (smaller: always)
  s.ids.erase(item_id);  // (before the item its view is of goes)
  s.c.items.erase(at);
  if (object) *object = ConversationStore::object(s.c);
  return Change::kDone;
}

ConversationStore::Change ConversationStore::set_metadata(const std::string& id, std::string metadata, json* object) {
  const std::lock_guard lock(mu_);
  const auto it = slots_.find(id);
  if (it == slots_.end()) return Change::kNoConversation;
  Slot& s = it->second;
  if (!resize(s, s.bytes - s.c.metadata.size() + metadata.size())) return Change::kOverTheCap;
  s.c.metadata = std::move(metadata);
  if (object) *object = ConversationStore::object(s.c);
  return Change::kDone;
}

// A response's hold on a conversation: let go (the conversation, if still stored, free again) when
// it goes.
class ConversationStore::Claim {
 public:
  Claim(ConversationStore& store, std::string id) : store_(store), id_(std::move(id)) {}
  Claim(const Claim&) = delete;
  Claim& operator=(const Claim&) = delete;
  ~Claim() { store_.release(id_); }

 private:
  ConversationStore& store_;
  const std::string id_;
};

ConversationStore::Change ConversationStore::claim(const std::string& id, Conversation& c, std::shared_ptr<void>& claim) {
  {
    const std::lock_guard lock(mu_);
    const auto it = slots_.find(id);
    if (it == slots_.end()) return Change::kNoConversation;
    if (it->second.busy) return Change::kBusy;
    it->second.busy = true;
    c = it->second.c;
  }
  claim = std::make_shared<Claim>(*this, id);
  return Change::kDone;
}

void ConversationStore::release(const std::string& id) {
  const std::lock_guard lock(mu_);
  if (const auto it = slots_.find(id); it != slots_.end()) it->second.busy = false;
}

json ConversationStore::object(const Conversation& c) {
  return {{"id", c.id}, {"object", "conversation"}, {"created_at", c.created_at}, {"metadata", json::parse(c.metadata)}};
}

std::vector<const ConversationStore::Item*> ConversationStore::items(const Conversation& c) {
  std::vector<const Item*> out;
  out.reserve(c.items.size());
  for (const auto& it : c.items) out.push_back(it.get());
  return out;
}

int64_t ConversationStore::size() const {
  const std::lock_guard lock(mu_);
  return int64_t(slots_.size());
}

uint64_t ConversationStore::bytes() const {
  const std::lock_guard lock(mu_);
  return bytes_;
}

}  // namespace ft::server
