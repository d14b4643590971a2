// The byte forms netqueue puts on the wire besides single candidates and results (those are
// kf::replay::encode's): lists of scored groups (learner ranks on other nodes), the group
// record an actor publishes to kf:groups, and the weights record of kf:weights. Private to
// netqueue (and its tests). Plain functions, any thread. Every decode checks each length
// against the buffer and throws kf::Error naming `context`, the record and the field.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kf/common/error.h"
#include "kf/replay/replay.h"

namespace kf::netqueue::detail {

// A kf:results entry that is no result: its candidate (the entry's tag) was never handed to
// the evaluators (its publish stopped after the group record went in), so the head marks
// it lost and its group completes without waiting for its deadline. No encoded result
// is this short.
inline constexpr const char* kLostMember = "lost";

// Little-endian fixed-width values and u32-length-prefixed bytes.
template <class T>
void put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(v));
}
inline void put_bytes(std::string& out, const std::string& s) {
  put<uint32_t>(out, static_cast<uint32_t>(s.size()));
  out += s;
}

// Reads what put/put_bytes wrote; errors name `context`, the record kind and the field.
struct Reader {
  const std::string& b;
  std::size_t pos = 0;
  const std::string& context;
  const char* record;
  [[noreturn]] void fail(const std::string& what) const {
    throw Error(context + ": " + record + ": " + what + " at byte " + std::to_string(pos) + " of " +
                std::to_string(b.size()));
  }
  template <class T>
  T get(const std::string& field) {
    if (b.size() - pos < sizeof(T)) fail("field " + field + " cut short");
    T v;
    std::memcpy(&v, b.data() + pos, sizeof(T));
    pos += sizeof(T);
    return v;
  }
  std::string bytes(const std::string& field) {
    const auto n = get<uint32_t>(field);
    if (b.size() - pos < n) fail("field " + field + " of " + std::to_string(n) + " bytes cut short");
    std::string s = b.substr(pos, n);
    pos += n;
    return s;
  }
};

std::string encode_record(const replay::Candidate& c);
std::string encode_record(const replay::Result& r);

// Scored groups (candidates and results in the replay's record encoding), "KFG1".
std::string encode_groups(const std::vector<replay::ScoredGroup>& groups);
std::vector<replay::ScoredGroup> decode_groups(const std::string& bytes, const std::string& context);

// The group record of kf:groups, "KFP1": what an actor publishes (GroupPublish), with the
// deadline as milliseconds from the publish.
struct PublishedGroup {
  uint64_t group_id = 0;
  int64_t deadline_ms = 0;
  bool hold = false;
  std::vector<replay::Candidate> candidates;
  std::vector<replay::Result> known;
};
std::string encode_published(const replay::GroupPublish& g);
PublishedGroup decode_published(const std::string& bytes, const std::string& context);

// The weights record of kf:weights: "KFW1", version (i64), size (u64), then the snapshot
// blob as the learner published it (policy/ weights blob format).
std::string encode_weights(int64_t version, const void* blob, std::size_t n);
// The blob stays in `rec`: *offset is where it starts.
void decode_weights(const std::string& rec, const std::string& context, int64_t* version, std::size_t* offset,
                    std::size_t* n);

}  // namespace kf::netqueue::detail
