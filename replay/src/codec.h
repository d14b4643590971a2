// Private byte writer/reader for the record and file encodings. The reader checks
// every length and names the record and field in its errors.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kf/common/error.h"

namespace kf::replay::detail {

class ByteWriter {
 public:
  explicit ByteWriter(unsigned char* dst) : p_(dst), start_(dst) {}
  template <typename T>
  void put(T v) {
    std::memcpy(p_, &v, sizeof v);
    p_ += sizeof v;
  }
  void bytes(const void* d, std::size_t n) {
    put<uint32_t>(static_cast<uint32_t>(n));
    if (n) std::memcpy(p_, d, n);
    p_ += n;
  }
  void str(const std::string& s) { bytes(s.data(), s.size()); }
  template <typename T>
  void vec(const std::vector<T>& v) {
    bytes(v.data(), v.size() * sizeof(T));
  }
  std::size_t written() const { return static_cast<std::size_t>(p_ - start_); }
  unsigned char* cur() { return p_; }
  void advance(std::size_t n) { p_ += n; }

 private:
  unsigned char* p_;
  unsigned char* start_;
};

class ByteReader {
 public:
  ByteReader(const unsigned char* src, std::size_t n, std::string what)
      : p_(src), end_(src + n), what_(std::move(what)) {}
  template <typename T>
  T get(const char* field) {
    need(sizeof(T), field);
    T v;
    std::memcpy(&v, p_, sizeof v);
    p_ += sizeof v;
    return v;
  }
  std::string str(const char* field) {
    uint32_t n = get<uint32_t>(field);
    need(n, field);
    std::string s(reinterpret_cast<const char*>(p_), n);
    p_ += n;
    return s;
  }
  template <typename T>
  std::vector<T> vec(const char* field) {
    uint32_t n = get<uint32_t>(field);
    if (n % sizeof(T) != 0) fail(field, "length " + std::to_string(n) + " is not a multiple of the element size");
    need(n, field);
    std::vector<T> v(n / sizeof(T));
    if (n) std::memcpy(v.data(), p_, n);
    p_ += n;
    return v;
  }
  const unsigned char* raw(std::size_t n, const char* field) {
    need(n, field);
    const unsigned char* r = p_;
    p_ += n;
    return r;
  }
  std::size_t left() const { return static_cast<std::size_t>(end_ - p_); }
  [[noreturn]] void fail(const char* field, const std::string& msg) const {
    throw Error(what_ + ": field " + field + ": " + msg);
  }

 private:
  void need(std::size_t n, const char* field) const {
    if (static_cast<std::size_t>(end_ - p_) < n)
      fail(field, "truncated (needs " + std::to_string(n) + " bytes, " + std::to_string(end_ - p_) + " left)");
  }
  const unsigned char* p_;
  const unsigned char* end_;
  std::string what_;
};

}  // namespace kf::replay::detail
