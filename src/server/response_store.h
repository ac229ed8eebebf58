// The Responses API's stored responses (store: true): what GET and DELETE /v1/responses/{id}, its
// input_items, previous_response_id and item_reference read. In memory, owned by the server (not
// the engine thread) and shared by the I/O threads under one mutex; bounded by a count and by
// bytes (Entry::bytes), the oldest stored first evicted (FIFO by the time each was stored; reading
// one does not renew it). A response keeps its own new input items and a link to the response it
// continues, never a copy of that one's conversation, so a chain of N turns holds each turn's
// items once; resolving a chain reaches back only while every link is still stored.
#pragma once
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace ft::server {

// A background response's stream (background and stream: true): its events' SSE text in order
// (the i-th has sequence_number i), for GET /v1/responses/{id}?stream=true&starting_after=N:
// what was sent, then, while it runs, what comes. Appended and published on its generation's
// strand; followed from any I/O thread.
class EventLog {
 public:
  // The text of the events published at once, and whether they end the stream.
  using Follower = std::function<void(const std::string& text, bool done)>;
  void append(std::string event);
  // Hands what was appended since the last publish to each follower, but events at or before
  // its `after` (done: the stream ended; the followers are let go). Followers whose owner is
  // gone are let go.
  void publish(bool done);
  // The published events after sequence number `after` (-1: all) and whether the stream ended;
  // unless it did, f gets each publish from now on (the events after `after`) while `owner` lives.
  std::pair<std::string, bool> follow(int64_t after, std::weak_ptr<void> owner, Follower f);
  uint64_t bytes() const;
  size_t followers() const;

 private:
  struct Follow {
    std::weak_ptr<void> owner;
    Follower f;
    size_t next;  // the first event it still wants
  };
  mutable std::mutex mu_;
  std::vector<std::string> events_;
  size_t published_ = 0;
  uint64_t bytes_ = 0;
  bool done_ = false;
  std::vector<Follow> followers_;
};

class ResponseStore {
 public:
  // An item as stored: its id and its JSON text.
  struct Item {
    std::string id, json;
  };
  struct Entry {
    std::string id;
    std::string previous_id;   // the response it continues ("" when none)
    std::vector<Item> input;   // its request's own input items (references resolved), each with an id
    std::vector<Item> output;  // its output items
    std::string response;      // the response object's JSON text without "output"
    // A background response not finished yet (status queued or in_progress, no output): read by
    // GET, not continued (previous_response_id) until replace() puts its finished self.
    bool pending = false;
    std::shared_ptr<EventLog> events;  // a background stream's (its bytes count as the entry's)
    // What it costs: its text, plus kEntryOverhead and item_bytes an item.
    uint64_t bytes() const;
  };
  static constexpr uint64_t kEntryOverhead = 256, kItemOverhead = 96;
  // An item's cost: its text, plus kItemOverhead (the index, the strings' and containers' own sizes).
  static uint64_t item_bytes(const Item& it) { return kItemOverhead + it.id.size() + it.json.size(); }

  // max_responses 0: nothing is ever stored. max_conversation_bytes: what one request may resolve
  // from the store (its chain's and its references' items, their text), so that a small request
  // cannot make an I/O thread parse the whole store (the server's: max_body_bytes, a body's limit).
  ResponseStore(int64_t max_responses, uint64_t max_bytes, uint64_t max_conversation_bytes = UINT64_MAX)
      : max_responses_(max_responses), max_bytes_(max_bytes), max_conversation_bytes_(max_conversation_bytes) {}
  ResponseStore(const ResponseStore&) = delete;
  ResponseStore& operator=(const ResponseStore&) = delete;

  // Stores e, evicting the oldest until it fits; false (nothing evicted) when it alone is over the
  // byte cap, the count cap is 0, or its id is already stored.
  bool put(Entry e);
  // Stores e in place of the stored response of its id (a background response's finished self, or
  // its new status), as the latest stored; false (nothing changed) when that id is not stored (deleted
  // or evicted meanwhile: it stays so), or only_pending and the stored one is no longer pending
  // (a status that must not undo a cancel stored meanwhile), or e alone is over the byte cap.
  bool replace(Entry e, bool only_pending = false);
  // id's stored size counted again (its EventLog grew after it was stored), the oldest others
  // evicted while the store is over its byte cap.
  void recount(const std::string& id);
  std::shared_ptr<const Entry> get(const std::string& id) const;
  bool erase(const std::string& id);  // false when not stored
  // An item of any stored response (input or output) by its id, its JSON text; nullopt when none.
  // One id in several responses (an item sent back whole as a later input): the latest stored.
  std::optional<std::string> item(const std::string& id) const;

  // id's chain: the stored responses it continues, oldest first, id's own last. missing: the first
  // link not stored ("" when the chain is whole; id itself when it is not stored).
  struct Chain {
    std::vector<std::shared_ptr<const Entry>> links;
    std::string missing;
  };
  Chain chain(const std::string& id) const;
  // A chain's conversation: each link's input items then its output items, oldest first (the last
  // link's output only with last_output); valid while c holds its links.
  static std::vector<const Item*> items(const Chain& c, bool last_output);
  // ... parsed.
  static std::vector<nlohmann::json> conversation(const Chain& c, bool last_output);
  static std::vector<nlohmann::json> parse(const std::vector<const Item*>& items);
  // A JSON array's items (each with a string "id") as stored.
  static std::vector<Item> to_items(const nlohmann::json& items);
  static uint64_t text_bytes(const std::vector<const Item*>& items);
  // A stored response's object, its output items put back.
  static nlohmann::json object(const Entry& e);
  // j's JSON text as stored and sent (invalid UTF-8 replaced, as every answer writes it).
  static std::string text(const nlohmann::json& j);

  uint64_t max_bytes() const { return max_bytes_; }
  int64_t max_responses() const { return max_responses_; }
  uint64_t max_conversation_bytes() const { return max_conversation_bytes_; }
  int64_t size() const;
  uint64_t bytes() const;

 private:
  struct Slot {
    std::shared_ptr<const Entry> entry;
    uint64_t bytes;
    std::list<std::string>::iterator order;  // its place in order_
  };
  void drop(std::unordered_map<std::string, Slot>::iterator it);  // under mu_
  void insert(std::shared_ptr<const Entry> entry, uint64_t bytes);  // under mu_: evicts until it fits

  const int64_t max_responses_;
  const uint64_t max_bytes_;
  const uint64_t max_conversation_bytes_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, Slot> entries_;
  std::list<std::string> order_;  // ids, oldest stored first
  // Item id -> the stored responses holding an item of that id (one item may be in several: an
  // output item sent back as a later request's input), each with its put()'s sequence number.
  std::unordered_multimap<std::string, std::pair<uint64_t, const Entry*>> items_;
  uint64_t puts_ = 0;
  uint64_t bytes_ = 0;
};

// The Conversations API's conversations (POST /v1/conversations; a response naming one in
// `conversation` adds its input and output items at its end): each its metadata and its items in
// order, items as the response store keeps them. In memory, shared by the I/O threads under one
// mutex; bounded as the response store is, apart from it (the same caps: a count, and bytes as
// ResponseStore::Entry counts them), the one written longest ago first evicted (written: created,
// items added or deleted, metadata set; reading does not renew one); one conversation at most
// max_conversation_bytes (what a response may read of it). Items are shared with readers: a read
// copies no text. A response holds its conversation (claim) while it runs: OpenAI's lock, one
// response at a time on a conversation.
class ConversationStore {
 public:
  using Item = ResponseStore::Item;
  struct Conversation {
    std::string id;
    int64_t created_at = 0;
    std::string metadata;  // its JSON text (an object)
    std::vector<std::shared_ptr<const Item>> items;  // oldest first
    uint64_t bytes() const;
  };
  // What a change did: kNoConversation (its id not stored), kNoItem (erase_item: not in it),
  // kDuplicate (add: an item id it holds, or twice among the new), kOverTheCap (it would be over
  // max_conversation_bytes(): nothing changed), kBusy (claim: a response holds it).
  enum class Change { kDone, kNoConversation, kNoItem, kDuplicate, kOverTheCap, kBusy };

  // max_conversation_bytes: one conversation's cap (the server's: max_body_bytes, what a response
  // may read of it), as Conversation::bytes counts.
  ConversationStore(int64_t max_conversations, uint64_t max_bytes, uint64_t max_conversation_bytes = UINT64_MAX)
      : max_conversations_(max_conversations), max_bytes_(max_bytes), max_conversation_bytes_(max_conversation_bytes) {}
  ConversationStore(const ConversationStore&) = delete;
  ConversationStore& operator=(const ConversationStore&) = delete;

  // Stores c, evicting the longest unwritten until it fits; false (nothing evicted) when it alone is
  // over max_conversation_bytes(), the count cap is 0, or its id is already stored.
  bool put(Conversation c);
  std::optional<Conversation> get(const std::string& id) const;
  bool erase(const std::string& id);  // false when not stored
  // For a response on id: kDone, c its conversation and `claim` held for it (until the last copy
  // goes, claim() of id is kBusy); else kNoConversation or kBusy, nothing changed.
  Change claim(const std::string& id, Conversation& c, std::shared_ptr<void>& claim);
  // items at id's end (duplicate: the first id it already holds, for kDuplicate).
  Change add(const std::string& id, const std::vector<Item>& items, std::string* duplicate = nullptr);
  // object (when not null): the conversation's object as the change left it (ConversationStore::object).
  Change erase_item(const std::string& id, const std::string& item_id, nlohmann::json* object = nullptr);
  Change set_metadata(const std::string& id, std::string metadata, nlohmann::json* object = nullptr);
  // Its object: {"id", "object": "conversation", "created_at", "metadata"}.
  static nlohmann::json object(const Conversation& c);
  // Its items as ResponseStore::text_bytes and a page take them; valid while c lives.
  static std::vector<const Item*> items(const Conversation& c);

  int64_t max_conversations() const { return max_conversations_; }
  uint64_t max_bytes() const { return max_bytes_; }
  // One conversation's cap: max_conversation_bytes, or the store's byte cap where smaller.
  uint64_t max_conversation_bytes() const { return max_conversation_bytes_ < max_bytes_ ? max_conversation_bytes_ : max_bytes_; }
  int64_t size() const;
  uint64_t bytes() const;

 private:
  struct Slot {
    Conversation c;
    uint64_t bytes;
    std::list<std::string>::iterator order;  // its place in order_
    std::unordered_set<std::string_view> ids;  // its items' ids (views of c.items' own)
    bool busy = false;                         // claimed
  };
  class Claim;
  void release(const std::string& id);  // a claim let go
  // Under mu_: the longest unwritten but `keep` (a stored one growing) evicted until `more` bytes
  // (and, new_one, one more conversation) fit.
  void make_room(uint64_t more, bool new_one, const std::string* keep);
  // Under mu_: s about to be written to `bytes` in all: false (nothing done) when that is over
  // max_conversation_bytes(); else room made for its growth, its size counted, and it the latest written.
  bool resize(Slot& s, uint64_t bytes);

  const int64_t max_conversations_;
  const uint64_t max_bytes_;
  const uint64_t max_conversation_bytes_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, Slot> slots_;
  std::list<std::string> order_;  // ids, longest unwritten first
  uint64_t bytes_ = 0;
};

}  // namespace ft::server
