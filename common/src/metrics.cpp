#include "kf/common/metrics.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <set>

#include "crc32c.h"
#include "kf/common/error.h"

namespace kf {
namespace {

double unix_now() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

// --- Protobuf wire format, just the parts event.proto needs (hand-encoded so the common
// library needs no protobuf dependency). A field key is (field_number << 3) | wire_type.
enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
void put_key(std::string& out, uint32_t field, WireType type) { put_varint(out, (uint64_t{field} << 3) | type); }
template <typename T>
void put_le(std::string& out, T bits) {
  for (std::size_t i = 0; i < sizeof(T); ++i) out.push_back(static_cast<char>((bits >> (8 * i)) & 0xFF));
}
void put_double(std::string& out, uint32_t field, double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  put_key(out, field, kFixed64);
  put_le(out, bits);
}
void put_float(std::string& out, uint32_t field, float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  put_key(out, field, kFixed32);
  put_le(out, bits);
}
void put_int64(std::string& out, uint32_t field, int64_t v) {
  put_key(out, field, kVarint);
  put_varint(out, static_cast<uint64_t>(v));  // negative int64: 10-byte two's complement, as protobuf does
}
void put_bytes(std::string& out, uint32_t field, const std::string& bytes) {
  put_key(out, field, kLengthDelimited);
  put_varint(out, bytes.size());
  out += bytes;
}

// tensorflow/core/util/event.proto: Event{double wall_time=1; int64 step=2;
// string file_version=3; Summary summary=5}; Summary{repeated Value value=1};
// Summary.Value{string tag=1; float simple_value=2}.
std::string event_header(double wall_time) {
  std::string e;
  put_double(e, 1, wall_time);
  put_bytes(e, 3, "brain.Event:2");
  return e;
}
std::string event_scalars(double wall_time, int64_t step, const std::string& stem,
                          const std::vector<std::pair<std::string, double>>& scalars) {
  std::string summary;
  for (const auto& [key, value] : scalars) {
    std::string v;
    put_bytes(v, 1, stem + "/" + key);
    put_float(v, 2, static_cast<float>(value));  // NaN/inf pass through: TensorBoard shows them
    put_bytes(summary, 1, v);
  }
  std::string e;
  put_double(e, 1, wall_time);
  put_int64(e, 2, step);
  put_bytes(e, 5, summary);
  return e;
}

std::string hostname() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0 || !buf[0]) return "localhost";
  std::string h = buf;
  for (char& c : h)
    if (c == '/') c = '_';
  return h;
}

// Opens a fresh event file; O_EXCL so two writers of one stem started in the same second
// by one process never truncate each other's file (the second gets a ".2" suffix).
std::FILE* open_events(const std::string& base, std::string& path) {
  for (int n = 1; n < 100; ++n) {
    path = n == 1 ? base : base + "." + std::to_string(n);
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd >= 0) {
      std::FILE* f = ::fdopen(fd, "wb");
      if (!f) ::close(fd);
      return f;
    }
    if (errno != EEXIST) return nullptr;
  }
  return nullptr;
}

}  // namespace

MetricsWriter::MetricsWriter(const std::string& dir, const std::string& stem) : stem_(stem) {
  if (stem.empty() || stem.find('/') != std::string::npos)
    throw error_at(dir, "metrics stream name '" + stem + "' must be non-empty without '/'");
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw error_at(dir, "cannot create the metrics folder: " + ec.message());
  jsonl_path_ = dir + "/" + stem + ".jsonl";
  jsonl_ = std::fopen(jsonl_path_.c_str(), "ae");
  if (!jsonl_) throw error_at(jsonl_path_, std::string("cannot open for appending: ") + std::strerror(errno));
  const double now = unix_now();
  const std::string base = dir + "/events.out.tfevents." + std::to_string(static_cast<int64_t>(now)) + "." +
                           hostname() + "." + std::to_string(::getpid()) + "." + stem;
  events_ = open_events(base, events_path_);
  if (!events_) {
    const int err = errno;
    std::fclose(jsonl_);
    throw error_at(events_path_, std::string("cannot create the TensorBoard event file: ") + std::strerror(err));
  }
  write_record(event_header(now));  // readers identify the format by this first event
  flush();
}

MetricsWriter::~MetricsWriter() {
  if (jsonl_) std::fclose(jsonl_);  // fclose flushes
  if (events_) std::fclose(events_);
}

void MetricsWriter::write_record(const std::string& data) {
  // TFRecord: u64 length, masked crc32c(length bytes), data, masked crc32c(data); all LE.
  std::string rec;
  rec.reserve(data.size() + 16);
  put_le(rec, static_cast<uint64_t>(data.size()));
  put_le(rec, detail::crc32c_mask(detail::crc32c(rec.data(), 8)));
  rec += data;
  put_le(rec, detail::crc32c_mask(detail::crc32c(data.data(), data.size())));
  if (std::fwrite(rec.data(), 1, rec.size(), events_) != rec.size())
    throw error_at(events_path_, std::string("write failed: ") + std::strerror(errno));
}

void MetricsWriter::write(int64_t step, const std::vector<std::pair<std::string, double>>& scalars,
                          const nlohmann::json& extra) {
  if (!extra.is_object()) throw error_at(jsonl_path_, "extra fields must be a JSON object, got " + extra.dump());
  std::set<std::string> seen;
  auto check_key = [&](const std::string& key) {
    if (key.empty()) throw error_at(jsonl_path_, "metric key is empty");
    if (key == "step" || key == "time") throw error_at(jsonl_path_, "metric key '" + key + "' is reserved");
    if (!seen.insert(key).second) throw error_at(jsonl_path_, "metric key '" + key + "' given twice");
  };
  for (const auto& kv : scalars) check_key(kv.first);
  for (const auto& kv : extra.items()) check_key(kv.key());

  const double now = unix_now();
  nlohmann::ordered_json line;
  line["step"] = step;
  line["time"] = now;
  for (const auto& [key, value] : scalars) {
    if (!std::isfinite(value))
      line[key] = nullptr;  // JSON has no NaN/inf
    else if (value == std::trunc(value) && std::fabs(value) < 9.0e15)
      line[key] = static_cast<int64_t>(value);
    else
      line[key] = value;  // counts read as integers ("groups":4, not 4.0); exact below 2^53
  }
  for (const auto& kv : extra.items()) line[kv.key()] = kv.value();
  std::string text;
  try {
    text = line.dump() + "\n";
  } catch (const nlohmann::json::exception& ex) {  // e.g. a key or string that is not UTF-8
    throw error_at(jsonl_path_,
                   std::string("cannot encode the record of step ") + std::to_string(step) + ": " + ex.what());
  }
  if (std::fwrite(text.data(), 1, text.size(), jsonl_) != text.size())
    throw error_at(jsonl_path_, std::string("write failed: ") + std::strerror(errno));
  if (!scalars.empty()) write_record(event_scalars(now, step, stem_, scalars));
  flush();
}

void MetricsWriter::flush() {
  if (std::fflush(jsonl_) != 0) throw error_at(jsonl_path_, std::string("flush failed: ") + std::strerror(errno));
  if (std::fflush(events_) != 0) throw error_at(events_path_, std::string("flush failed: ") + std::strerror(errno));
}

}  // namespace kf
