// netqueue test helpers: a fresh redis-server per test (free port, random password),
// so parallel CTest jobs never share a server and a test may kill its own.
#pragma once
#include <gtest/gtest.h>

#include <chrono>
#include <random>
#include <string>

#include "kf/netqueue/netqueue.h"

namespace kf::netqueue::test {

inline std::string random_password() {
  std::random_device rd;
  std::mt19937_64 g(rd());
  const char* alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  std::string s;
  for (int i = 0; i < 24; ++i) s += alphabet[g() % 62];
  return s;
}

inline RedisServer start_server() {
  ServerOptions o;
  o.password = random_password();
  return RedisServer::start(o);
}

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace kf::netqueue::test
