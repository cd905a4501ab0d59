// The metrics endpoint's bound on its connections (server/rpc/metrics.h, MetricsServer) when
// every one of its 64 slots holds a connection that has sent its request and is being
// answered: a peer that never reads its answer. The daemon's own metrics are far smaller than
// what the kernel buffers for a connection, so they would be written out at once; this server
// renders an answer larger than that. Idle connections (state="waiting") are tested on a real
// ferryd in tests/integration/metrics_test.cc.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "rpc/metrics.h"

namespace ferry::rpc {
namespace {

constexpr int kSlots = 64;  // the connections MetricsServer holds at once

// A TCP socket as a slow reader makes it: a 4 KiB receive buffer (the kernel doubles it) and
// 536-byte segments, both set before it connects, so that the window it offers is small and
// so is the send buffer the kernel gives the server's end (sized from the segment size); -1
// on error.
int SlowReaderSocket() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int receive_buffer = 4096, segment = 536;
  if (fd >= 0 &&
      (::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &receive_buffer, sizeof receive_buffer) != 0 ||
       ::setsockopt(fd, IPPROTO_TCP, TCP_MAXSEG, &segment, sizeof segment) != 0)) {
    ::close(fd);
    return -1;
  }
  return fd;
}

bool ConnectToPort(int fd, uint16_t port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
}

// A connection to `endpoint` ("127.0.0.1:PORT"), a slow reader's when `slow`; its
// descriptor, or -1.
int Connect(const std::string& endpoint, bool slow = false) {
  const int fd = slow ? SlowReaderSocket() : ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (!ConnectToPort(fd,
                     static_cast<uint16_t>(std::stoi(endpoint.substr(endpoint.rfind(':') + 1))))) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// How many bytes a server can hand the kernel for a slow reader that reads nothing, before
// its write must wait: measured on a connection of the test's own, made as the slow readers
// make theirs and accepted as MetricsServer accepts (no socket option set), written to until
// the kernel takes no more, a few times (its buffers grow as the peer acknowledges). 0 on
// error.
size_t BytesBufferedForASlowReader() {
  const int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  socklen_t len = sizeof addr;
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  size_t buffered = 0;
  if (listener >= 0 && ::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      ::listen(listener, 1) == 0 &&
      ::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    const int reader = SlowReaderSocket();
    if (reader >= 0 && ConnectToPort(reader, ntohs(addr.sin_port))) {
      const int writer = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      const std::string chunk(65536, '#');
      for (int round = 0; writer >= 0 && round < 5; ++round) {
        for (ssize_t n; (n = ::send(writer, chunk.data(), chunk.size(), MSG_NOSIGNAL)) > 0;) {
          buffered += static_cast<size_t>(n);
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      if (writer >= 0) ::close(writer);
    }
    if (reader >= 0) ::close(reader);
  }
  if (listener >= 0) ::close(listener);
  return buffered;
}

// Read from `fd` until `enough` says what has come is enough, the stream ends (or is reset),
// or nothing comes for `idle`; what came.
template <typename Enough>
std::string Read(int fd, Enough enough, std::chrono::milliseconds idle) {
  std::string got;
  char buf[65536];
  while (!enough(got)) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(idle.count())) <= 0) break;
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
  }
  return got;
}

std::string ReadToEnd(int fd) {
  return Read(
      fd, [](const std::string&) { return false; }, std::chrono::seconds(10));
}

// The size an HTTP response of body length `content_length` has, headers included, for a
// response `head` (at least its headers); 0 when `head` holds no end of the headers.
size_t WholeResponseBytes(const std::string& head, size_t content_length) {
  const size_t end = head.find("\r\n\r\n");
  return end == std::string::npos ? 0 : end + 4 + content_length;
}

// The eviction's other branch, state="answering": 64 peers that each sent a scrape
// and never read its answer hold every slot while their answers are written (each answer is
// larger than what the kernel buffers for a connection, so none is written out). A new
// scraper still gets its whole answer, not after their 5 s timeout: the oldest of them is
// closed for it, its answer cut short, and counted as evicted while answering; the newest
// one is not closed (draining it then, it gets its whole answer).
TEST(MetricsServerTest, SlowReadersHoldingEverySlotDoNotLockOutTheScraper) {
  const size_t buffered = BytesBufferedForASlowReader();
  ASSERT_GT(buffered, 0u);
  std::printf("the kernel buffers %zu bytes for a slow reader\n", buffered);
  // Four times what the kernel buffers for a slow reader: no answer is written out.
  const size_t padding = 4 * buffered;
  auto server = MetricsServer::Start("127.0.0.1:0", [padding](const MetricsEndpointStats& s) {
    return "evicted_waiting " + std::to_string(s.evicted_waiting) + "\nevicted_answering " +
           std::to_string(s.evicted_answering) + "\n" + std::string(padding, '#');
  });
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  const std::string endpoint = (*server)->endpoint();
  const std::string request = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
  const size_t body_bytes =
      std::string("evicted_waiting 0\nevicted_answering 0\n").size() + padding;

  // Each slow reader reads its answer's headers and first line, so the server has read its
  // request and is answering it before the next one connects; then it reads nothing more.
  std::vector<int> slow;
  std::vector<std::string> heads;
  for (int i = 0; i < kSlots; ++i) {
    const int fd = Connect(endpoint, /*slow=*/true);
    ASSERT_GE(fd, 0) << i;
    slow.push_back(fd);
    ASSERT_EQ(::send(fd, request.data(), request.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(request.size()))
        << i;
    heads.push_back(Read(
        fd,
        [](const std::string& got) {
          const size_t end = got.find("\r\n\r\n");
          return end != std::string::npos && got.find('\n', end + 4) != std::string::npos;
        },
        std::chrono::seconds(2)));
    ASSERT_EQ(heads.back().rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << i << ": " << heads.back();
  }

  const int scraper = Connect(endpoint);
  ASSERT_GE(scraper, 0);
  ASSERT_EQ(::send(scraper, request.data(), request.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(request.size()));
  const std::string response = ReadToEnd(scraper);
  ::close(scraper);
  ASSERT_EQ(response.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << response.substr(0, 200);
  EXPECT_EQ(response.size(), WholeResponseBytes(response, body_bytes));
  const size_t body = response.find("\r\n\r\n") + 4;
  EXPECT_EQ(response.substr(body, response.find('#', body) - body),
            "evicted_waiting 0\nevicted_answering 1\n");

  // The oldest slow reader was closed: reading on, its answer ends short.
  const std::string oldest = heads.front() + ReadToEnd(slow.front());
  EXPECT_LT(oldest.size(), WholeResponseBytes(oldest, body_bytes)) << "the oldest was not closed";
  // The newest was not: its answer is whole.
  const std::string newest = heads.back() + ReadToEnd(slow.back());
  EXPECT_EQ(newest.size(), WholeResponseBytes(newest, body_bytes));
  for (int fd : slow) ::close(fd);
}

}  // namespace
}  // namespace ferry::rpc
