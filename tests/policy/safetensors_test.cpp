#include <gtest/gtest.h>

#include <cstring>

#include "kf/common/error.h"
#include "kf/policy/policy.h"
#include "test_util.h"

using namespace kf::policy;
using kf::policy::test::TempDir;

namespace {

// A file image: u64 header length, header, data.
std::string image(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  uint64_t n = header.size();
  std::memcpy(&out[0], &n, 8);
  return out + header + data;
}

std::string parse_error(const std::string& bytes) {
  try {
    st_parse(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "ck/model.safetensors");
  } catch (const kf::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(PolicySafetensorsTest, ParsesValidHeader) {
  const std::string b = image(
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"__metadata__":{"format":"pt"}})", std::string(8, '\1'));
  const auto h = st_parse(reinterpret_cast<const uint8_t*>(b.data()), b.size(), "x");
  ASSERT_EQ(h.tensors.size(), 1u);
  EXPECT_EQ(h.tensors[0].shape, (std::vector<int64_t>{2}));
  EXPECT_EQ(h.metadata.at("format"), "pt");
}

TEST(PolicySafetensorsTest, RejectsTruncatedAndOutOfBoundsWithFileAndField) {
  const std::string good = image(R"({"w":{"dtype":"BF16","shape":[4],"data_offsets":[0,8]}})", std::string(8, '\0'));
  // Truncated data: the offsets now point past the end.
  std::string e = parse_error(good.substr(0, good.size() - 3));
  EXPECT_NE(e.find("ck/model.safetensors"), std::string::npos) << e;
  EXPECT_NE(e.find("data_offsets"), std::string::npos) << e;
  // Truncated header.
  e = parse_error(good.substr(0, 20));
  EXPECT_NE(e.find("header length"), std::string::npos) << e;
  EXPECT_NE(parse_error("abc").find("too short"), std::string::npos);
  // Header length pointing outside the file.
  std::string huge = good;
  const uint64_t big = 1ull << 40;
  std::memcpy(&huge[0], &big, 8);
  EXPECT_NE(parse_error(huge).find("header length"), std::string::npos);
}

TEST(PolicySafetensorsTest, RejectsCorruptHeaders) {
  EXPECT_NE(parse_error(image("{bad json", "")).find("not valid JSON"), std::string::npos);
  EXPECT_NE(parse_error(image(R"({"w":{"dtype":"Q4","shape":[1],"data_offsets":[0,1]}})", "x")).find("'dtype'"),
            std::string::npos);
  // Shape and span disagree.
  EXPECT_NE(parse_error(image(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", std::string(8, 0)))
                .find("need 12"),
            std::string::npos);
  // Element count overflows 64 bits (would wrap to a small span without the check).
  EXPECT_NE(parse_error(image(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,0]}})", ""))
                .find("overflow"),
            std::string::npos);
  // Overlapping tensors.
  EXPECT_NE(parse_error(image(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},
                                  "b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                              std::string(12, 0)))
                .find("overlaps"),
            std::string::npos);
  EXPECT_NE(parse_error(image(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,0]}})", "")).find("'shape'"),
            std::string::npos);
}

TEST(PolicySafetensorsTest, WriteThenOpenRoundTrips) {
  TempDir d;
  const std::string path = d.path + "/t.safetensors";
  const float a[3] = {1.f, 2.f, 3.f};
  const uint16_t b[2] = {7, 9};
  st_write(path, {{"a", "F32", {3}}, {"b", "BF16", {1, 2}}}, [&](std::size_t i, std::string& out) {
    if (i == 0)
      out.assign(reinterpret_cast<const char*>(a), sizeof a);
    else
      out.assign(reinterpret_cast<const char*>(b), sizeof b);
  });
  auto f = StFile::open(path);
  ASSERT_NE(f->find("b"), nullptr);
  EXPECT_EQ(std::memcmp(f->data(*f->find("a")), a, sizeof a), 0);
  EXPECT_EQ(std::memcmp(f->data(*f->find("b")), b, sizeof b), 0);
  EXPECT_EQ(f->header().data_begin % 8, 0u);
  // A fill producing the wrong size is an error, and no file is left behind.
  EXPECT_THROW(st_write(d.path + "/bad.safetensors", {{"a", "F32", {3}}}, [](std::size_t, std::string& o) { o = "x"; }),
               kf::Error);
  EXPECT_THROW(StFile::open(d.path + "/bad.safetensors"), kf::Error);
}

TEST(PolicySafetensorsTest, MissingShardNamesIndex) {
  TempDir d;
  kf::policy::test::write_file(d.path + "/model.safetensors.index.json",
                               R"({"weight_map": {"w": "model-00001-of-00002.safetensors"}})");
  try {
    StCheckpoint::open(d.path);
    FAIL() << "expected an error";
  } catch (const kf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("model-00001-of-00002.safetensors"), std::string::npos) << e.what();
  }
}
