// ferryd's --metrics-listen: a real daemon scraped over TCP loopback.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "ferry/client.h"
#include "ferryd_process.h"
#include "metrics_scrape.h"

namespace ferry {
namespace {

using testing::HttpExchange;
using testing::HttpGet;
using testing::MetricsEndpoint;
using testing::ResponseBody;
using testing::Value;

TEST(MetricsTest, ServesPrometheusTextThatMovesWithWork) {
  testing::FerrydProcess daemon({"--metrics-listen", "127.0.0.1:0"});
  ASSERT_TRUE(daemon.ok()) << daemon.log();
  std::string ep = MetricsEndpoint(daemon);
  ASSERT_FALSE(ep.empty()) << "no metrics: line in the ready file";
  ASSERT_EQ(ep.rfind("127.0.0.1:", 0), 0u) << ep;
  EXPECT_NE(ep, "127.0.0.1:0");

  std::string before = HttpGet(ep, "/metrics");
  ASSERT_EQ(before.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << before;
  EXPECT_NE(before.find("Content-Type: text/plain; version=0.0.4"), std::string::npos);
  std::string body = ResponseBody(before);
  // DCGM-style labels on every series.
  EXPECT_TRUE(
      std::regex_search(body, std::regex(R"(ferry_sessions_open\{gpu="0",UUID="[^"]+"\} 0)")))
      << body;
  for (const char* family :
       {"ferry_sessions_total", "ferry_submits_total", "ferry_ops_total",
        "ferry_transfer_bytes_total", "ferry_device_memory_used_bytes",
        "ferry_device_memory_free_bytes", "ferry_slab_pool_slabs", "ferry_device_faults_total",
        "ferry_device_resets_total", "ferry_submit_latency_seconds", "ferry_copy_turns_held",
        "ferry_copy_turns_waiting", "ferry_copy_turn_waits_total", "ferry_submit_rings",
        "ferry_submit_ring_messages_total"}) {
    EXPECT_NE(body.find("# TYPE " + std::string(family) + " "), std::string::npos) << family;
  }
  // The bounds against hostile clients (slab socket, doorbells) and the per-uid usage.
  for (const char* family : {"ferry_submit_ring_doorbell_mutes_total",
                             "ferry_slab_connections_closed_total",
                             "ferry_slab_accept_backoffs_total",
                             "ferry_uid_sessions",
                             "ferry_uid_device_bytes",
                             "ferry_uid_pinned_bytes",
                             "ferry_uid_submits_in_flight",
                             "ferry_uid_max_sessions",
                             "ferry_uid_max_device_bytes",
                             "ferry_uid_max_pinned_bytes",
                             "ferry_uid_max_submits_in_flight",
                             "ferry_uid_in_flight_bytes",
                             "ferry_uid_max_in_flight_bytes",
                             "ferry_in_flight_bytes",
                             "ferry_in_flight_bytes_limit",
                             "ferry_uid_objects",
                             "ferry_uid_max_objects",
                             "ferry_uid_queued_commands",
                             "ferry_uid_max_queued_commands",
                             "ferry_objects",
                             "ferry_objects_limit",
                             "ferry_slab_acquires_waiting",
                             "ferry_slab_pool_made_total",
                             "ferry_slab_pool_made_on_grant_total"}) {
    EXPECT_NE(body.find("# TYPE " + std::string(family) + " "), std::string::npos) << family;
  }
  // The slab made ahead at start (initial-slabs 1); no acquire yet.
  EXPECT_EQ(Value(body, "ferry_slab_pool_made_total"), 1);
  EXPECT_EQ(Value(body, "ferry_slab_pool_made_on_grant_total"), 0);
  EXPECT_EQ(Value(body, "ferry_slab_acquires_waiting"), 0);
  EXPECT_EQ(Value(body, "ferry_in_flight_bytes"), 0);
  EXPECT_EQ(Value(body, "ferry_in_flight_bytes_limit"), 4.0 * (1ull << 30));
  EXPECT_EQ(Value(body, "ferry_objects"), 0);
  EXPECT_EQ(Value(body, "ferry_objects_limit"), 4194304);
  EXPECT_EQ(Value(body, "ferry_submits_total"), 0);
  EXPECT_EQ(Value(body, "ferry_copy_turns_held", "direction=\"upload\""), 0);
  EXPECT_EQ(Value(body, "ferry_copy_turn_waits_total"), 0);
  EXPECT_EQ(Value(body, "ferry_submit_rings"), 0);
  EXPECT_EQ(Value(body, "ferry_submit_ring_messages_total"), 0);
  // Transfers are per usage identity (usage_metrics_test.cc): none before any session.
  EXPECT_EQ(Value(body, "ferry_transfer_bytes_total", "direction=\"upload\""), -1);

  auto client = Client::connect(daemon.unix_target());
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  auto session = client->open_session();
  ASSERT_TRUE(session.ok()) << session.status().ToString();
  std::vector<float> x(4096, 1.0f);
  Tensor a = session->create_tensor<float>({4096});
  ASSERT_TRUE(session->upload(a, x).ok());
  auto back = session->download<float>(a);
  ASSERT_TRUE(back.ok()) << back.status().ToString();

  // A session open: the gauge says so; the counters moved. The daemon records a submit's
  // latency as it delivers the Completed, just after the completion board told the client:
  // scrape until the download's is there (the last submit's; the others' come before it).
  std::string during;
  for (int i = 0; i < 500; ++i) {
    during = ResponseBody(HttpGet(ep, "/metrics"));
    if (Value(during, "ferry_transfer_latency_seconds_count") >= 2) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(Value(during, "ferry_sessions_open"), 1) << during;
  EXPECT_GE(Value(during, "ferry_submits_total"), 2) << during;
  EXPECT_GE(Value(during, "ferry_ops_total"), 2) << during;
  // libferry sent its submits through the session's submit ring.
  EXPECT_EQ(Value(during, "ferry_submit_rings"), 1) << during;
  EXPECT_GE(Value(during, "ferry_submit_ring_messages_total"), 2) << during;
  EXPECT_GE(Value(during, "ferry_transfer_bytes_total", "direction=\"upload\""), 4096 * 4)
      << during;
  // Usage of this process's identity.
  const std::string me = "identity=\"uid:" + std::to_string(getuid()) + "\"";
  EXPECT_EQ(Value(during, "ferry_uid_sessions", me), 1) << during;
  EXPECT_EQ(Value(during, "ferry_uid_device_bytes", me), 4096 * 4) << during;
  EXPECT_GE(Value(during, "ferry_transfer_bytes_total", "direction=\"download\""), 4096 * 4)
      << during;
  EXPECT_GE(Value(during, "ferry_submit_latency_seconds_count"), 2) << during;
  EXPECT_EQ(Value(during, "ferry_submit_latency_seconds_bucket", "le=\"+Inf\""),
            Value(during, "ferry_submit_latency_seconds_count"));
  // The upload and the download are transfers; the create alone was not.
  EXPECT_GE(Value(during, "ferry_transfer_latency_seconds_count"), 2) << during;
  EXPECT_LT(Value(during, "ferry_transfer_latency_seconds_count"),
            Value(during, "ferry_submit_latency_seconds_count"))
      << during;
  ASSERT_TRUE(session->close().ok());
  daemon.WaitIdle();
  std::string after = HttpGet(ep, "/metrics");
  after = ResponseBody(after);
  EXPECT_EQ(Value(after, "ferry_sessions_open"), 0) << after;
  EXPECT_EQ(Value(after, "ferry_sessions_total"), 1) << after;
}

TEST(MetricsTest, AnswersOtherPathsAndMethodsWithErrors) {
  testing::FerrydProcess daemon({"--metrics-listen", "127.0.0.1:0"});
  ASSERT_TRUE(daemon.ok()) << daemon.log();
  std::string ep = MetricsEndpoint(daemon);
  EXPECT_EQ(HttpGet(ep, "/").rfind("HTTP/1.1 404", 0), 0u);
  EXPECT_EQ(HttpGet(ep, "/metricsx").rfind("HTTP/1.1 404", 0), 0u);
  EXPECT_EQ(HttpExchange(ep, "POST /metrics HTTP/1.1\r\nHost: x\r\n\r\n").rfind("HTTP/1.1 405", 0),
            0u);
  EXPECT_EQ(HttpExchange(ep, "garbage\r\n\r\n").rfind("HTTP/1.1 400", 0), 0u);
  // Still serving after the bad requests.
  EXPECT_EQ(HttpGet(ep, "/metrics").rfind("HTTP/1.1 200", 0), 0u);
}

// A TCP connection to the metrics endpoint `ep` (HOST:PORT of 127.0.0.1) that sends nothing;
// its descriptor, or -1.
int ConnectIdle(const std::string& ep) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(std::stoi(ep.substr(ep.rfind(':') + 1))));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Whether the server has closed the connection `fd` (end of file or a reset), waiting up to
// `wait_ms` for it.
bool ClosedByServer(int fd, int wait_ms = 0) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, wait_ms) <= 0) return false;
  char byte;
  errno = 0;
  const ssize_t n = ::recv(fd, &byte, 1, MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno == ECONNRESET);
}

// The endpoint needs no credentials, so anyone who reaches it may open connections and send
// nothing: it holds at most 64 at once, and a new one past them closes the oldest still
// waiting for its request, so that such a flood holds at most 64 of the daemon's descriptors
// (each for at most the 5 s request timeout); once the flood is gone, it serves again.
TEST(MetricsTest, IdleConnectionsBeyondTheCapAreClosedOldestFirst) {
  testing::FerrydProcess daemon({"--metrics-listen", "127.0.0.1:0"});
  ASSERT_TRUE(daemon.ok()) << daemon.log();
  const std::string ep = MetricsEndpoint(daemon);
  constexpr int kConnections = 200, kHeld = 64;
  std::vector<int> fds;
  for (int i = 0; i < kConnections; ++i) {
    const int fd = ConnectIdle(ep);
    ASSERT_GE(fd, 0) << i;
    fds.push_back(fd);
  }
  // The closed ones have read end of file (or a reset) within a second; the held ones have
  // not (the server waits 5 s for their request).
  std::this_thread::sleep_for(std::chrono::seconds(1));
  int closed = 0;
  for (int i = 0; i < kConnections; ++i) {
    const bool c = ClosedByServer(fds[i]);
    closed += c;
    EXPECT_EQ(c, i < kConnections - kHeld) << "connection " << i << " of " << kConnections;
  }
  std::printf("%d of %d idle connections closed\n", closed, kConnections);
  for (int fd : fds) ::close(fd);
  EXPECT_TRUE(testing::Eventually(
      [&] { return HttpGet(ep, "/metrics").rfind("HTTP/1.1 200", 0) == 0; }, 10));
}

// Open more idle connections to the metrics endpoint of a ferryd started with `args` than it
// holds, keep them open, then send one scrape `request` (not retried): expect the metrics, and
// the flood's newest connections still open.
void ExpectScrapeServedPastAnIdleFlood(const std::vector<std::string>& args,
                                       const std::string& request) {
  testing::FerrydProcess daemon(args);
  ASSERT_TRUE(daemon.ok()) << daemon.log();
  const std::string ep = MetricsEndpoint(daemon);
  // The server accepts them in this order, before the scrape's.
  constexpr int kSlots = 64, kIdle = kSlots + 16;
  std::vector<int> idle;
  for (int i = 0; i < kIdle; ++i) {
    const int fd = ConnectIdle(ep);
    ASSERT_GE(fd, 0) << i;
    idle.push_back(fd);
  }
  const std::string response = HttpExchange(ep, request);
  EXPECT_EQ(response.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << "scrape refused: " << response;
  EXPECT_NE(ResponseBody(response).find("# TYPE ferry_sessions_open gauge"), std::string::npos)
      << response;
  // The flood's connections past the 64, and the one that made room for the scrape.
  EXPECT_EQ(
      Value(ResponseBody(response), "ferry_metrics_connections_evicted_total", "state=\"waiting\""),
      kIdle - kSlots + 1)
      << response;
  EXPECT_EQ(Value(ResponseBody(response), "ferry_metrics_connections_evicted_total",
                  "state=\"answering\""),
            0)
      << response;
  // The flood's newest 63 connections are still held: the scrape was served while they
  // waited, not after their timeout. The older ones were closed to make room, oldest first
  // (the last of them for the scrape).
  const int evicted = kIdle - (kSlots - 1);
  for (int i = evicted; i < kIdle; ++i) EXPECT_FALSE(ClosedByServer(idle[i])) << i;
  for (int i = 0; i < evicted; ++i) EXPECT_TRUE(ClosedByServer(idle[i], 1000)) << i;
  for (int fd : idle) ::close(fd);
}

// Regression: whoever reached the endpoint, with or without --metrics-token-file (the token is
// checked once the request is read), could hold all of its 64 connections with idle ones that
// send nothing, opening them again every 5 s, and meanwhile the scraper's connections were
// closed at accept. Now a connection that finds the endpoint full closes the oldest one still
// waiting for its request: one scrape, not retried, gets the metrics while the flood's newer
// connections are still open (so it did not wait for their timeout), and the flood still holds
// no more than 63 of the daemon's descriptors next to the scraper's.
TEST(MetricsTest, IdleConnectionsHoldingEverySlotDoNotLockOutTheScraper) {
  {
    SCOPED_TRACE("no token");
    ExpectScrapeServedPastAnIdleFlood({"--metrics-listen", "127.0.0.1:0"},
                                      "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  }
  const testing::TempFile tokens("scrape-token\n");
  ASSERT_FALSE(tokens.path().empty());
  SCOPED_TRACE("metrics-token-file");
  ExpectScrapeServedPastAnIdleFlood(
      {"--metrics-listen", "127.0.0.1:0", "--metrics-token-file", tokens.path()},
      "GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer scrape-token\r\n\r\n");
}

// With --metrics-token-file every request needs "Authorization: Bearer <token>" with a token
// of the file: without one, or with a wrong one, it gets 401 with "WWW-Authenticate: Bearer"
// and no metrics, whatever its path; with one of them (any line of the file) the metrics.
TEST(MetricsTest, TokenFileRestrictsTheEndpointToScrapersWithAToken) {
  const testing::TempFile tokens("# the scrapers' tokens\n  scrape-token-a \n\nscrape-token-b\n");
  ASSERT_FALSE(tokens.path().empty());
  testing::FerrydProcess daemon(
      {"--metrics-listen", "127.0.0.1:0", "--metrics-token-file", tokens.path()});
  ASSERT_TRUE(daemon.ok()) << daemon.log();
  const std::string ep = MetricsEndpoint(daemon);
  ASSERT_FALSE(ep.empty()) << "no metrics: line in the ready file";
  auto get = [&](const std::string& path, const std::string& headers) {
    return HttpExchange(ep, "GET " + path + " HTTP/1.1\r\nHost: x\r\n" + headers + "\r\n");
  };
  auto refused = [](const std::string& response) {
    return response.rfind("HTTP/1.1 401 Unauthorized\r\n", 0) == 0 &&
           response.find("\r\nWWW-Authenticate: Bearer\r\n") != std::string::npos &&
           response.find("ferry_") == std::string::npos;
  };

  // No token.
  std::string none = HttpGet(ep, "/metrics");
  EXPECT_TRUE(refused(none)) << none;
  EXPECT_TRUE(refused(HttpExchange(ep, "HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n")));
  // Other paths say nothing either (no 404 before the token).
  EXPECT_TRUE(refused(HttpGet(ep, "/")));
  // Wrong tokens: another, a prefix or an extension of a right one, the file's comment, the
  // right one in another scheme or without one.
  for (const char* header :
       {"Authorization: Bearer wrong-token\r\n", "Authorization: Bearer scrape-token-\r\n",
        "Authorization: Bearer scrape-token-ab\r\n",
        "Authorization: Bearer # the scrapers' tokens\r\n", "Authorization: Bearer \r\n",
        "Authorization: Basic scrape-token-a\r\n", "Authorization: scrape-token-a\r\n",
        "X-Authorization: Bearer scrape-token-a\r\n"}) {
    std::string response = get("/metrics", header);
    EXPECT_TRUE(refused(response)) << header << response;
  }

  // The right tokens: each line of the file, the scheme and the header name in any case.
  for (const char* header :
       {"Authorization: Bearer scrape-token-a\r\n", "Authorization: Bearer scrape-token-b\r\n",
        "authorization:bearer   scrape-token-a  \r\n"}) {
    std::string response = get("/metrics", header);
    ASSERT_EQ(response.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << header << response;
    EXPECT_NE(ResponseBody(response).find("# TYPE ferry_sessions_open gauge"), std::string::npos)
        << response;
    EXPECT_EQ(Value(ResponseBody(response), "ferry_sessions_open"), 0) << response;
  }
  // Prometheus' request, with the token among other headers.
  std::string scrape = get("/metrics",
                           "Accept: text/plain;version=0.0.4\r\nAuthorization: Bearer "
                           "scrape-token-b\r\nUser-Agent: Prometheus/2.53.0\r\n");
  EXPECT_EQ(scrape.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << scrape;
  // With the token, the other answers are as without --metrics-token-file.
  EXPECT_EQ(get("/", "Authorization: Bearer scrape-token-a\r\n").rfind("HTTP/1.1 404", 0), 0u);
  EXPECT_EQ(HttpExchange(ep,
                         "POST /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                         "scrape-token-a\r\n\r\n")
                .rfind("HTTP/1.1 405", 0),
            0u);
}

// A metrics token file that cannot be read, or holds no token, is an error at start: ferryd
// does not start (rather than serving the metrics to everyone, or to no one).
TEST(MetricsTest, UnreadableOrEmptyTokenFileFailsTheStart) {
  {
    testing::FerrydProcess daemon({"--metrics-listen", "127.0.0.1:0", "--metrics-token-file",
                                   "/nonexistent/ferry-metrics-token"});
    EXPECT_FALSE(daemon.ok());
    EXPECT_NE(daemon.log().find("cannot read metrics token file /nonexistent/ferry-metrics-token"),
              std::string::npos)
        << daemon.log();
  }
  const testing::TempFile empty("# no token yet\n\n   \n");
  ASSERT_FALSE(empty.path().empty());
  testing::FerrydProcess daemon(
      {"--metrics-listen", "127.0.0.1:0", "--metrics-token-file", empty.path()});
  EXPECT_FALSE(daemon.ok());
  EXPECT_NE(daemon.log().find("holds no token"), std::string::npos) << daemon.log();
}

TEST(MetricsTest, FerryctlMetricsPrintsTheExposition) {
  testing::FerrydProcess daemon({"--metrics-listen", "127.0.0.1:0"});
  ASSERT_TRUE(daemon.ok()) << daemon.log();
  std::string out_path = ::testing::TempDir() + "/ferryctl_metrics.out";
  std::string cmd = testing::ProgramPath("FERRY_TEST_FERRYCTL", FERRYCTL_PATH) +
                    " metrics --metrics " + MetricsEndpoint(daemon) + " > " + out_path;
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::ifstream in(out_path);
  std::string text((std::istreambuf_iterator<char>(in)), {});
  EXPECT_NE(text.find("# TYPE ferry_sessions_open gauge"), std::string::npos) << text;
  EXPECT_EQ(std::system((testing::ProgramPath("FERRY_TEST_FERRYCTL", FERRYCTL_PATH) +
                         " metrics > /dev/null 2>&1")
                            .c_str()) >>
                    8 &
                0xff,
            3);  // usage: no endpoint
}

// ferryctl metrics sends the token of --token-file (or stdin, --token -) as the bearer token
// that --metrics-token-file asks for.
TEST(MetricsTest, FerryctlMetricsSendsItsToken) {
  const testing::TempFile tokens("scrape-token-a\n");
  const testing::TempFile wrong("wrong\n");
  testing::FerrydProcess daemon(
      {"--metrics-listen", "127.0.0.1:0", "--metrics-token-file", tokens.path()});
  ASSERT_TRUE(daemon.ok()) << daemon.log();
  const std::string ctl = testing::ProgramPath("FERRY_TEST_FERRYCTL", FERRYCTL_PATH) +
                          " metrics --metrics " + MetricsEndpoint(daemon);
  std::string out_path = ::testing::TempDir() + "/ferryctl_metrics_token.out";
  for (const std::string& token :
       {" --token-file " + tokens.path(), " --token - < " + tokens.path()}) {
    ASSERT_EQ(std::system((ctl + token + " > " + out_path).c_str()), 0) << token;
    std::ifstream in(out_path);
    std::string text((std::istreambuf_iterator<char>(in)), {});
    EXPECT_NE(text.find("# TYPE ferry_sessions_open gauge"), std::string::npos) << text;
  }
  // Without it, or with another, the endpoint refuses: critical (2).
  EXPECT_EQ(std::system((ctl + " > /dev/null 2>&1").c_str()) >> 8 & 0xff, 2);
  EXPECT_EQ(
      std::system((ctl + " --token-file " + wrong.path() + " > /dev/null 2>&1").c_str()) >> 8 &
          0xff,
      2);
}

}  // namespace
}  // namespace ferry
