#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "kf/common/error.h"
#include "kf/common/safetensors.h"

namespace fs = std::filesystem;

namespace {

std::string temp_file(const std::string& name) {
  return fs::temp_directory_path() / ("kf_st_" + std::to_string(::getpid()) + "_" + name);
}

void write_raw(const std::string& path, const std::string& header, const std::string& data) {
  std::ofstream out(path, std::ios::binary);
  uint64_t n = header.size();
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << header << data;
}

std::string open_error(const std::string& path) {
  try {
    kf::SafetensorsFile::open(path);
  } catch (const kf::Error& e) {
    return e.what();
  }
  return "";
}

TEST(SafetensorsTest, WriteThenReadRoundTrips) {
  const std::string path = temp_file("rt.safetensors");
  std::vector<float> a = {1.5f, -2.f, 3.25f, 0.f, 7.f, 8.f};
  std::vector<int64_t> b = {42, -7};
  kf::safetensors_write(path, {{"w.a", "F32", {2, 3}, a.data(), a.size() * 4}, {"b", "I64", {2}, b.data(), 16}},
                        {{"format", "pt"}});
  auto f = kf::SafetensorsFile::open(path);
  ASSERT_EQ(f->tensors().size(), 2u);
  const auto& va = f->get("w.a");
  EXPECT_EQ(va.dtype, "F32");
  EXPECT_EQ(va.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(std::memcmp(va.data, a.data(), 24), 0);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(va.data) % 8, 0u) << "data is 8-byte aligned";
  EXPECT_EQ(std::memcmp(f->get("b").data, b.data(), 16), 0);
  EXPECT_EQ(f->metadata().at("format"), "pt");
  EXPECT_FALSE(f->has("zzz"));
  EXPECT_THROW(f->get("zzz"), kf::Error);
  fs::remove(path);
}

TEST(SafetensorsTest, RejectsOffsetsBeyondTheFile) {
  const std::string path = temp_file("oob.safetensors");
  write_raw(path, R"({"x":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", std::string(8, '\0'));
  const std::string e = open_error(path);
  EXPECT_NE(e.find(path), std::string::npos) << e;
  EXPECT_NE(e.find("tensor 'x'"), std::string::npos) << e;
  EXPECT_NE(e.find("outside the data"), std::string::npos) << e;
  fs::remove(path);
}

TEST(SafetensorsTest, RejectsBadHeaders) {
  const std::string path = temp_file("bad.safetensors");
  write_raw(path, R"({"x":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}})", std::string(16, '\0'));
  EXPECT_NE(open_error(path).find("shape and dtype need 12"), std::string::npos);
  write_raw(path, R"({"x":{"dtype":"Q7","shape":[1],"data_offsets":[0,1]}})", std::string(1, '\0'));
  EXPECT_NE(open_error(path).find("field 'dtype'"), std::string::npos);
  // An element count that wraps to 0 bytes must not pass as an empty tensor.
  write_raw(path, R"({"x":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}})", "");
  EXPECT_NE(open_error(path).find("overflows"), std::string::npos) << open_error(path);
  write_raw(path, "{not json", "");
  EXPECT_NE(open_error(path).find("not valid JSON"), std::string::npos);
  {  // header length larger than the file
    std::ofstream out(path, std::ios::binary);
    uint64_t n = 1 << 20;
    out.write(reinterpret_cast<const char*>(&n), 8);
    out << "{}";
  }
  EXPECT_NE(open_error(path).find("exceeds the file"), std::string::npos) << open_error(path);
  {
    std::ofstream out(path, std::ios::binary);
    out << "abc";
  }
  EXPECT_NE(open_error(path).find("too short"), std::string::npos);
  EXPECT_NE(open_error(path + ".absent").find("cannot open"), std::string::npos);
  // Two tensors over the same bytes: a task file is held to the checkpoints' rule (one parser).
  write_raw(
      path,
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
      std::string(12, '\0'));
  EXPECT_NE(open_error(path).find("overlaps tensor 'a'"), std::string::npos) << open_error(path);
  fs::remove(path);
}

}  // namespace
