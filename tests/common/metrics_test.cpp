// kf::MetricsWriter: the JSONL read back line by line, and the TensorBoard event file read
// back by TensorBoard's own EventAccumulator (tests/common/tb_readback.py), so the
// hand-encoded protobuf + TFRecord framing is checked by an independent reader.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "../test_support.h"
#include "crc32c.h"
#include "kf/common/error.h"
#include "kf/common/metrics.h"

namespace {

std::vector<nlohmann::json> read_jsonl(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::istringstream in(kf::test::read_file(path));
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

// Runs a command line, returns its exit status; stdout to `out`, stderr to `err`.
int run_capture(const std::string& cmd, std::string& out, std::string& err, const std::string& tmp) {
  const std::string err_file = tmp + "/stderr.txt";
  std::FILE* p = ::popen((cmd + " 2>" + err_file).c_str(), "r");
  if (!p) return -1;
  char buf[4096];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  const int status = ::pclose(p);
  err = kf::test::read_file(err_file);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string quote(const std::string& s) { return "'" + s + "'"; }

}  // namespace

TEST(MetricsTest, Crc32cKnownVectors) {
  // The check value of CRC-32C (Castagnoli) from the CRC catalogue, and RFC 3720's vectors.
  EXPECT_EQ(kf::detail::crc32c("123456789", 9), 0xE3069283u);
  const std::string zeros(32, '\0'), ones(32, '\xff');
  EXPECT_EQ(kf::detail::crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);
  EXPECT_EQ(kf::detail::crc32c(ones.data(), ones.size()), 0x62A8AB43u);
  EXPECT_EQ(kf::detail::crc32c("", 0), 0u);
  // Continuing from a partial checksum gives the checksum of the whole.
  EXPECT_EQ(kf::detail::crc32c("6789", 4, kf::detail::crc32c("12345", 5)), 0xE3069283u);
  // The TFRecord mask: rotate right 15, add 0xa282ead8 (mod 2^32).
  EXPECT_EQ(kf::detail::crc32c_mask(0u), 0xa282ead8u);
  EXPECT_EQ(kf::detail::crc32c_mask(0xE3069283u), ((0xE3069283u >> 15) | (0xE3069283u << 17)) + 0xa282ead8u);
}

TEST(MetricsTest, JsonlLinesReadBack) {
  kf::test::TempDir tmp("metrics");
  const std::string dir = tmp.path + "/metrics";  // created by the writer
  const double t0 = static_cast<double>(::time(nullptr));
  {
    kf::MetricsWriter w(dir, "learner");
    EXPECT_EQ(w.jsonl_path(), dir + "/learner.jsonl");
    w.write(1, {{"loss", 0.5}, {"lr", 1e-4}});
    w.write(2, {{"loss", std::nan("")}, {"lr", INFINITY}}, {{"codes", {{"no_code", 3}}}, {"task", "001_relu"}});
    w.write(3, {});
  }
  {
    kf::MetricsWriter again(dir, "learner");  // a restarted process appends
    again.write(4, {{"loss", 0.25}});
    again.write(5, {{"groups", 12.0}, {"half", 2.5}});
  }
  const auto lines = read_jsonl(dir + "/learner.jsonl");
  ASSERT_EQ(lines.size(), 5u);
  EXPECT_EQ(lines[0]["step"], 1);
  EXPECT_DOUBLE_EQ(lines[0]["loss"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(lines[0]["lr"].get<double>(), 1e-4);
  EXPECT_GE(lines[0]["time"].get<double>(), t0 - 1);
  EXPECT_LE(lines[0]["time"].get<double>(), t0 + 60);
  EXPECT_TRUE(lines[1]["loss"].is_null());  // NaN and inf: null in JSON
  EXPECT_TRUE(lines[1]["lr"].is_null());
  EXPECT_EQ(lines[1]["codes"]["no_code"], 3);
  EXPECT_EQ(lines[1]["task"], "001_relu");
  EXPECT_EQ(lines[2].size(), 2u);  // step and time only
  EXPECT_EQ(lines[3]["step"], 4);
  EXPECT_TRUE(lines[4]["groups"].is_number_integer()) << lines[4];  // integral values read as counts
  EXPECT_EQ(lines[4]["groups"], 12);
  EXPECT_DOUBLE_EQ(lines[4]["half"].get<double>(), 2.5);
  EXPECT_DOUBLE_EQ(lines[3]["loss"].get<double>(), 0.25);
  // Field order: step, time first (easy to read with head/tail).
  std::istringstream raw(kf::test::read_file(dir + "/learner.jsonl"));
  std::string first;
  std::getline(raw, first);
  EXPECT_EQ(first.rfind("{\"step\":1,\"time\":", 0), 0u) << first;
}

TEST(MetricsTest, BadKeysAndPathsAreNamed) {
  kf::test::TempDir tmp("metrics");
  kf::MetricsWriter w(tmp.path, "run");
  auto message = [&](auto&& fn) {
    try {
      fn();
    } catch (const kf::Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_NE(message([&] { w.write(1, {{"", 1.0}}); }).find("key is empty"), std::string::npos);
  EXPECT_NE(message([&] { w.write(1, {{"step", 1.0}}); }).find("'step' is reserved"), std::string::npos);
  EXPECT_NE(message([&] { w.write(1, {{"a", 1.0}, {"a", 2.0}}); }).find("'a' given twice"), std::string::npos);
  EXPECT_NE(message([&] { w.write(1, {{"a", 1.0}}, {{"a", "x"}}); }).find("'a' given twice"), std::string::npos);
  EXPECT_NE(message([&] { w.write(1, {}, nlohmann::json::array()); }).find("JSON object"), std::string::npos);
  // Nothing was written by the rejected calls.
  EXPECT_EQ(kf::test::read_file(w.jsonl_path()), "");
  // A folder that cannot be made: the error names it.
  const std::string blocker = tmp.path + "/file";
  kf::test::write_file(blocker, "x");
  const std::string msg = message([&] { kf::MetricsWriter bad(blocker + "/metrics", "learner"); });
  EXPECT_NE(msg.find(blocker + "/metrics"), std::string::npos) << msg;
  EXPECT_NE(message([&] { kf::MetricsWriter bad(tmp.path, "a/b"); }).find("'a/b'"), std::string::npos);
}

TEST(MetricsTest, TensorBoardReadsTheEventFile) {
  kf::test::TempDir tmp("metrics");
  std::string events;
  {
    kf::MetricsWriter w(tmp.path, "learner");
    events = w.events_path();
    const std::string base = events.substr(events.rfind('/') + 1);
    EXPECT_EQ(base.rfind("events.out.tfevents.", 0), 0u) << base;
    EXPECT_EQ(base.substr(base.size() - 8), ".learner") << base;
    EXPECT_NE(base.find("." + std::to_string(::getpid()) + "."), std::string::npos) << base;
    w.write(0, {{"loss", 1.5}, {"reward", -0.25}});
    w.write(1, {{"loss", 1.25}, {"reward", 0.5}}, {{"note", "jsonl only"}});
    w.write(2, {{"loss", 1.0}, {"reward", std::nan("")}});
    w.write(7, {{"loss", 3.0e7}});        // steps need not be consecutive; float precision in TB
    w.write(8, {}, {{"only", "extra"}});  // no scalars: no event
  }
  std::string out, err;
  const int rc = run_capture(quote(kf::test::python()) + " " +
                                 quote(kf::test::source_dir() + "/tests/common/tb_readback.py") + " " + quote(events),
                             out, err, tmp.path);
  ASSERT_NE(rc, 3) << "the tensorboard Python package is missing (" << kf::test::python()
                   << "); install requirements.txt with ./setup.sh: " << err;
  ASSERT_EQ(rc, 0) << "tb_readback.py failed: " << err;
  const auto j = nlohmann::json::parse(out);
  EXPECT_EQ(j["file_version"], 2.0) << out;  // "brain.Event:2"
  const auto& s = j["scalars"];
  ASSERT_EQ(s.size(), 2u) << out;  // tags are "<stem>/<key>"; extras are not scalars
  ASSERT_TRUE(s.contains("learner/loss")) << out;
  ASSERT_TRUE(s.contains("learner/reward")) << out;
  const auto& loss = s["learner/loss"];
  ASSERT_EQ(loss.size(), 4u) << out;
  const int64_t steps[] = {0, 1, 2, 7};
  const double values[] = {1.5, 1.25, 1.0, 3.0e7};
  const double now = static_cast<double>(::time(nullptr));
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(loss[i][0].get<int64_t>(), steps[i]);
    EXPECT_DOUBLE_EQ(loss[i][1].get<double>(), values[i]);  // all exact in float32
    EXPECT_NEAR(loss[i][2].get<double>(), now, 60.0);       // wall_time in unix seconds
  }
  const auto& reward = s["learner/reward"];
  ASSERT_EQ(reward.size(), 3u) << out;
  EXPECT_DOUBLE_EQ(reward[0][1].get<double>(), -0.25);
  EXPECT_DOUBLE_EQ(reward[1][1].get<double>(), 0.5);
  EXPECT_EQ(reward[2][1], "nan");  // NaN goes to TensorBoard as-is
}

TEST(MetricsTest, CorruptRecordStopsTensorBoardAtTheDamage) {
  // TensorBoard drops everything from the first record whose CRC fails, so flipping one
  // byte of the last record must lose exactly that record: the checksums are really checked.
  kf::test::TempDir tmp("metrics");
  std::string events;
  {
    kf::MetricsWriter w(tmp.path, "run");
    events = w.events_path();
    w.write(1, {{"x", 1.0}});
    w.write(2, {{"x", 2.0}});
  }
  std::string bytes = kf::test::read_file(events);
  bytes[bytes.size() - 6] ^= 0x01;  // inside the last record's float value
  kf::test::write_file(events, bytes);
  std::string out, err;
  const int rc = run_capture(quote(kf::test::python()) + " " +
                                 quote(kf::test::source_dir() + "/tests/common/tb_readback.py") + " " + quote(events),
                             out, err, tmp.path);
  ASSERT_NE(rc, 3) << "the tensorboard Python package is missing (" << kf::test::python()
                   << "); install requirements.txt with ./setup.sh: " << err;
  ASSERT_EQ(rc, 0) << err;
  const auto j = nlohmann::json::parse(out);
  ASSERT_EQ(j["scalars"]["run/x"].size(), 1u) << out;
  EXPECT_EQ(j["scalars"]["run/x"][0][0], 1);
}
