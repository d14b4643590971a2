// KeyStore against a real redis-server: binary values round-trip (as the policy snapshot
// the head publishes for actor nodes), MSET is all-or-nothing, a missing key is none, the
// ACL keeps the user to its prefix, and a killed server is an error naming it.
#include <string>

#include "kf/common/error.h"
#include "kf/netqueue/netqueue.h"
#include "test_util.h"

namespace kf::netqueue {
namespace {

using test::start_server;

TEST(NetqueueKeyStoreTest, BinaryValuesRoundTripAndMissingKeysAreNone) {
  auto srv = start_server();
  auto ks = KeyStore::open(srv.client_config());
  std::string blob(3u << 20, '\0');  // 3 MiB with zeros, newlines and every byte value
  for (std::size_t i = 0; i < blob.size(); ++i) blob[i] = static_cast<char>((i * 131 + 7) & 0xff);
  ks.set("kf:weights", blob);
  ks.set_many({{"kf:a", "1"}, {"kf:b", std::string("x\0y", 3)}});
  auto other = KeyStore::open(srv.client_config());  // another connection (another node)
  const auto got = other.get("kf:weights");
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->size(), blob.size());
  EXPECT_TRUE(*got == blob);
  EXPECT_EQ(other.get("kf:a").value_or(""), "1");
  EXPECT_EQ(other.get("kf:b").value_or(""), std::string("x\0y", 3));
  EXPECT_FALSE(other.get("kf:never-set").has_value());
}

TEST(NetqueueKeyStoreTest, KeysOutsideThePrefixAndADeadServerAreErrorsNamingIt) {
  auto srv = start_server();
  auto ks = KeyStore::open(srv.client_config());
  try {
    ks.set("other:key", "v");
    FAIL() << "a key outside kf: was written";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("redis at 127.0.0.1:" + std::to_string(srv.port())), std::string::npos)
        << e.what();
  }
  srv.kill();
  try {
    (void)ks.get("kf:a");
    FAIL() << "no error from a dead server";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("redis at 127.0.0.1:" + std::to_string(srv.port())), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace kf::netqueue
