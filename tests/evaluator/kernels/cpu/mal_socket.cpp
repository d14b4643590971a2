// malicious: opens a network socket and tries to connect out.
#include <kf/kernel.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

extern "C" int kf_forward(kf::Context*, const kf::Tensor*, int, kf::Tensor*, int) {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  if (s < 0) return 7;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(80);
  a.sin_addr.s_addr = htonl(0x7f000001);
  connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a);
  close(s);
  return 0;
}
