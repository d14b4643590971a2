// Byte forms of scored-group lists, published groups and weights records (records.h).
#include "records.h"

namespace kf::netqueue::detail {

namespace {
const char kGroupsMagic[4] = {'K', 'F', 'G', '1'};
const char kPublishedMagic[4] = {'K', 'F', 'P', '1'};
const char kWeightsMagic[4] = {'K', 'F', 'W', '1'};

replay::Candidate candidate_of(const std::string& s, const std::string& context) {
  return replay::decode_candidate(reinterpret_cast<const unsigned char*>(s.data()), s.size(), context);
}
replay::Result result_of(const std::string& s, const std::string& context) {
  return replay::decode_result(reinterpret_cast<const unsigned char*>(s.data()), s.size(), context);
}
}  // namespace

std::string encode_record(const replay::Candidate& c) {
  std::string s(replay::encoded_size(c), '\0');
  replay::encode(c, reinterpret_cast<unsigned char*>(s.data()));
  return s;
}

std::string encode_record(const replay::Result& r) {
  std::string s(replay::encoded_size(r), '\0');
  replay::encode(r, reinterpret_cast<unsigned char*>(s.data()));
  return s;
}

std::string encode_groups(const std::vector<replay::ScoredGroup>& groups) {
  std::string out(kGroupsMagic, 4);
  put<uint32_t>(out, static_cast<uint32_t>(groups.size()));
  for (const auto& g : groups) {
    if (g.results.size() != g.candidates.size() || g.missing.size() != g.candidates.size())
      throw Error("encode_groups: group " + std::to_string(g.group_id) + " has " + std::to_string(g.candidates.size()) +
                  " candidates, " + std::to_string(g.results.size()) + " results and " +
                  std::to_string(g.missing.size()) + " missing flags (must be equal)");
    put<uint64_t>(out, g.group_id);
    put_bytes(out, g.task);
    put<int64_t>(out, g.policy_version);
    put<uint32_t>(out, static_cast<uint32_t>(g.prompt_tokens.size()));
    out.append(reinterpret_cast<const char*>(g.prompt_tokens.data()), g.prompt_tokens.size() * sizeof(int32_t));
    put<uint32_t>(out, static_cast<uint32_t>(g.candidates.size()));
    for (std::size_t i = 0; i < g.candidates.size(); ++i) {
      put_bytes(out, encode_record(g.candidates[i]));
      put_bytes(out, encode_record(g.results[i]));
      put<uint8_t>(out, g.missing[i]);
    }
    put<uint8_t>(out, g.deadline_hit ? 1 : 0);
  }
  return out;
}

std::vector<replay::ScoredGroup> decode_groups(const std::string& bytes, const std::string& context) {
  Reader rd{bytes, 0, context, "scored groups record"};
  if (bytes.size() < 4 || std::memcmp(bytes.data(), kGroupsMagic, 4) != 0)
    rd.fail("not a scored groups record (magic)");
  rd.pos = 4;
  const auto n = rd.get<uint32_t>("count");
  std::vector<replay::ScoredGroup> out;
  for (uint32_t k = 0; k < n; ++k) {
    replay::ScoredGroup g;
    g.group_id = rd.get<uint64_t>("group_id");
    g.task = rd.bytes("task");
    g.policy_version = rd.get<int64_t>("policy_version");
    const auto np = rd.get<uint32_t>("prompt length");
    if ((bytes.size() - rd.pos) / sizeof(int32_t) < np) rd.fail("prompt tokens cut short");
    g.prompt_tokens.resize(np);
    std::memcpy(g.prompt_tokens.data(), bytes.data() + rd.pos, np * sizeof(int32_t));
    rd.pos += np * sizeof(int32_t);
    const auto nc = rd.get<uint32_t>("candidates");
    for (uint32_t i = 0; i < nc; ++i) {
      const std::string c = rd.bytes("candidate"), r = rd.bytes("result");
      g.candidates.push_back(candidate_of(c, context));
      g.results.push_back(result_of(r, context));
      g.missing.push_back(rd.get<uint8_t>("missing"));
    }
    g.deadline_hit = rd.get<uint8_t>("deadline_hit") != 0;
    out.push_back(std::move(g));
  }
  if (rd.pos != bytes.size()) rd.fail(std::to_string(bytes.size() - rd.pos) + " trailing bytes");
  return out;
}

std::string encode_published(const replay::GroupPublish& g) {
  if (g.candidates.empty()) throw Error("group record: a group needs at least one candidate");
  std::string out(kPublishedMagic, 4);
  put<uint64_t>(out, g.candidates.front().group_id);
  put<int64_t>(out, std::chrono::duration_cast<std::chrono::milliseconds>(g.deadline).count());
  put<uint8_t>(out, g.hold ? 1 : 0);
  put<uint32_t>(out, static_cast<uint32_t>(g.candidates.size()));
  for (const auto& c : g.candidates) put_bytes(out, encode_record(c));
  put<uint32_t>(out, static_cast<uint32_t>(g.known.size()));
  for (const auto& r : g.known) put_bytes(out, encode_record(r));
  return out;
}

PublishedGroup decode_published(const std::string& bytes, const std::string& context) {
  Reader rd{bytes, 0, context, "group record"};
  if (bytes.size() < 4 || std::memcmp(bytes.data(), kPublishedMagic, 4) != 0) rd.fail("not a group record (magic)");
  rd.pos = 4;
  PublishedGroup g;
  g.group_id = rd.get<uint64_t>("group_id");
  g.deadline_ms = rd.get<int64_t>("deadline_ms");
  if (g.deadline_ms < 0) rd.fail("field deadline_ms is negative (" + std::to_string(g.deadline_ms) + ")");
  const auto hold = rd.get<uint8_t>("hold");
  if (hold > 1) rd.fail("field hold is " + std::to_string(hold) + " (0 or 1)");
  g.hold = hold == 1;
  const auto nc = rd.get<uint32_t>("candidates");
  if (nc == 0 || nc > 4096) rd.fail("field candidates counts " + std::to_string(nc) + " (1..4096)");
  for (uint32_t i = 0; i < nc; ++i) {
    const std::string field = "candidate " + std::to_string(i);
    g.candidates.push_back(candidate_of(rd.bytes(field), context + ": group record: " + field));
    if (g.candidates.back().group_id != g.group_id)
      rd.fail("field " + field + " belongs to group " + std::to_string(g.candidates.back().group_id) + ", not " +
              std::to_string(g.group_id));
  }
  const auto nk = rd.get<uint32_t>("known");
  if (nk > nc)
    rd.fail("field known counts " + std::to_string(nk) + " results for " + std::to_string(nc) + " candidates");
  for (uint32_t i = 0; i < nk; ++i) {
    const std::string field = "known result " + std::to_string(i);
    g.known.push_back(result_of(rd.bytes(field), context + ": group record: " + field));
    if (g.known.back().index_in_group >= nc)
      rd.fail("field " + field + " names member " + std::to_string(g.known.back().index_in_group) + " of " +
              std::to_string(nc));
  }
  if (rd.pos != bytes.size()) rd.fail(std::to_string(bytes.size() - rd.pos) + " trailing bytes");
  return g;
}

std::string encode_weights(int64_t version, const void* blob, std::size_t n) {
  std::string s(kWeightsMagic, 4);
  s.reserve(20 + n);
  put<int64_t>(s, version);
  put<uint64_t>(s, n);
  s.append(static_cast<const char*>(blob), n);
  return s;
}

void decode_weights(const std::string& rec, const std::string& context, int64_t* version, std::size_t* offset,
                    std::size_t* n) {
  Reader rd{rec, 0, context, "weights record"};
  if (rec.size() < 4 || std::memcmp(rec.data(), kWeightsMagic, 4) != 0) rd.fail("not a weights record (magic)");
  rd.pos = 4;
  *version = rd.get<int64_t>("version");
  const auto size = rd.get<uint64_t>("size");
  if (size != rec.size() - rd.pos)
    rd.fail("field size says " + std::to_string(size) + " bytes but " + std::to_string(rec.size() - rd.pos) +
            " follow");
  *offset = rd.pos;
  *n = static_cast<std::size_t>(size);
}

}  // namespace kf::netqueue::detail
