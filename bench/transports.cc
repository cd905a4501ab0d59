// The bare transports of the baseline: what a round trip costs with nothing behind it.
//
//  * socketpair ping-pong: 16 B back and forth between this process and a child (a
//    re-executed ferry-bench --worker pong), over an AF_UNIX stream socketpair.
//  * gRPC echo: a child (ferry-bench --worker echo-server) serving bench/echo.proto with a
//    callback bidi reactor, as ferryd serves sessions; this process drives it with a sync
//    ClientReaderWriter, as libferry does, on a channel with libferry's message-size limits.
//    The server listens on the socket kinds the targets use (Unix, and TCP loopback when a
//    target is TCP).
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <iostream>

#include "bench.h"
#include "echo.grpc.pb.h"
#include "process.h"

namespace ferry::bench {
namespace {

// The same limits as ferryd's server (--max-message default 64 MiB) and libferry's channel
// (80 MiB), so bulk messages are treated alike.
constexpr int kServerMaxMessage = 64 << 20;
constexpr int kClientMaxMessage = 80 << 20;
constexpr uint64_t kSmallBytes = 16;
constexpr uint64_t kBulkBytes = 8ull << 20;

class EchoReactor : public grpc::ServerBidiReactor<EchoRequest, EchoReply> {
 public:
  EchoReactor() { StartRead(&request_); }
  void OnReadDone(bool ok) override {
    if (!ok) return Finish(grpc::Status::OK);
    reply_.mutable_data()->assign(request_.reply_bytes(), 'e');
    StartWrite(&reply_);
  }
  void OnWriteDone(bool ok) override {
    if (!ok) return Finish(grpc::Status(grpc::StatusCode::CANCELLED, "write failed"));
    StartRead(&request_);
  }
  void OnDone() override { delete this; }

 private:
  EchoRequest request_;
  EchoReply reply_;
};

class EchoService final : public Echo::CallbackService {
  grpc::ServerBidiReactor<EchoRequest, EchoReply>* Echo(grpc::CallbackServerContext*) override {
    return new EchoReactor();
  }
};

struct EchoServer {
  Child child;
  std::vector<std::string> endpoints;  // "unix:PATH", "tcp:127.0.0.1:PORT"
  void Stop() {
    if (child.pid <= 0) return;
    kill(child.pid, SIGTERM);
    if (WaitChild(child.pid, std::chrono::seconds(10)) == -1) {
      kill(child.pid, SIGKILL);
      WaitChild(child.pid, std::chrono::seconds(5));
    }
    child.pid = -1;
  }
};

EchoServer StartEchoServer(const Context& ctx, bool tcp) {
  EchoServer s;
  std::string ready = ctx.temp_dir + "/echo.ready";
  std::vector<std::string> args = {"--worker",     "echo-server",
                                   "--listen",     "unix:" + ctx.temp_dir + "/echo.sock",
                                   "--ready-file", ready};
  if (tcp) {
    args.push_back("--listen");
    args.push_back("tcp:127.0.0.1:0");
  }
  s.child = SpawnChild(ctx.self_exe, args, false, false, ctx.temp_dir + "/echo.log");
  if (s.child.pid <= 0) Die("cannot start the gRPC echo server");
  s.endpoints = WaitReadyFile(ready, s.child.pid, std::chrono::seconds(30));
  if (s.endpoints.empty()) Die("the gRPC echo server did not start (see its log)");
  return s;
}

/// Drive one echo stream: `iterations` requests of `send` bytes answered with `reply`
/// bytes, one at a time; return each round trip's time.
Samples EchoRoundTrips(const std::string& endpoint, uint64_t send, uint64_t reply, int iterations) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kClientMaxMessage);
  args.SetMaxSendMessageSize(kClientMaxMessage);
  std::string target = endpoint.rfind("tcp:", 0) == 0 ? endpoint.substr(4) : endpoint;
  auto channel = grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
  if (!channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(10))) {
    Die("cannot connect to the gRPC echo server at " + endpoint);
  }
  auto stub = Echo::NewStub(channel);
  grpc::ClientContext context;
  auto stream = stub->Echo(&context);
  EchoRequest request;
  request.mutable_data()->assign(send, 'r');
  request.set_reply_bytes(reply);
  EchoReply answer;
  Samples samples;
  int warmup = std::max(2, iterations / 20);
  for (int i = 0; i < warmup + iterations; ++i) {
    auto t0 = Clock::now();
    if (!stream->Write(request) || !stream->Read(&answer)) Die("the gRPC echo stream broke");
    if (i >= warmup) samples.Add(NsSince(t0));
  }
  stream->WritesDone();
  grpc::Status st = stream->Finish();
  if (!st.ok()) Die("gRPC echo stream: " + st.error_message());
  return samples;
}

/// 16 B ping-pong over a socketpair with a child process; return each round trip's time.
Samples SocketpairPingPong(const Context& ctx, int iterations) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) Die("socketpair failed");
  Child pong = SpawnChild(ctx.self_exe, {"--worker", "pong"}, false, false, "", sv[1]);
  close(sv[1]);
  if (pong.pid <= 0) Die("cannot start the ping-pong worker");
  char buf[kSmallBytes];
  std::memset(buf, 'p', sizeof buf);
  Samples samples;
  int warmup = std::max(10, iterations / 20);
  for (int i = 0; i < warmup + iterations; ++i) {
    auto t0 = Clock::now();
    if (!WriteAll(sv[0], buf, sizeof buf)) Die("ping-pong write failed");
    size_t got = 0;
    while (got < sizeof buf) {
      ssize_t n = read(sv[0], buf + got, sizeof buf - got);
      if (n <= 0) Die("ping-pong read failed");
      got += static_cast<size_t>(n);
    }
    if (i >= warmup) samples.Add(NsSince(t0));
  }
  close(sv[0]);  // EOF ends the worker
  WaitChild(pong.pid, std::chrono::seconds(10));
  return samples;
}

void MeasureEcho(const Context& ctx, const std::string& endpoint, TransportFigures* out) {
  int small = ctx.Iterations(3000, 300);
  int bulk = ctx.options.quick ? 4 : 30;
  out->grpc_small_rtt = EchoRoundTrips(endpoint, kSmallBytes, kSmallBytes, small);
  out->grpc_bulk_up = EchoRoundTrips(endpoint, kBulkBytes, kSmallBytes, bulk);
  out->grpc_bulk_down = EchoRoundTrips(endpoint, kSmallBytes, kBulkBytes, bulk);
  out->bulk_bytes = kBulkBytes;
  out->measured = true;
}

void AddTransportRows(const std::string& kind, const TransportFigures& f, Table* t) {
  auto us = [](const Samples& s, double Summary::*q) { return Summarize(s).*q / 1e3; };
  auto gbps = [&](const Samples& s) { return f.bulk_bytes / Summarize(s).p50; };
  auto row = [&](std::string label, std::vector<Figure> figs, const char* key, const Samples& s) {
    Row r{std::move(label), std::move(figs)};
    r.tags.push_back({"socket", kind});
    r.summaries.push_back({key, Summarize(s)});
    t->rows.push_back(std::move(r));
  };
  if (!f.socketpair_rtt.empty()) {
    row("socketpair ping-pong 16 B (2 processes)",
        {{"p50 us", kNaN, us(f.socketpair_rtt, &Summary::p50)},
         {"p99 us", kNaN, us(f.socketpair_rtt, &Summary::p99)}},
        "baseline", f.socketpair_rtt);
  }
  row("gRPC echo 16 B round trip (" + kind + ")",
      {{"p50 us", kNaN, us(f.grpc_small_rtt, &Summary::p50)},
       {"p99 us", kNaN, us(f.grpc_small_rtt, &Summary::p99)}},
      "baseline", f.grpc_small_rtt);
  row("gRPC 8 MiB request, 16 B reply (" + kind + ")",
      {{"p50 us", kNaN, us(f.grpc_bulk_up, &Summary::p50)},
       {"p99 us", kNaN, us(f.grpc_bulk_up, &Summary::p99)},
       {"GB/s", kNaN, gbps(f.grpc_bulk_up)}},
      "baseline", f.grpc_bulk_up);
  row("gRPC 16 B request, 8 MiB reply (" + kind + ")",
      {{"p50 us", kNaN, us(f.grpc_bulk_down, &Summary::p50)},
       {"p99 us", kNaN, us(f.grpc_bulk_down, &Summary::p99)},
       {"GB/s", kNaN, gbps(f.grpc_bulk_down)}},
      "baseline", f.grpc_bulk_down);
}

}  // namespace

std::vector<Table> RunTransports(Context& ctx) {
  bool tcp = false;
  for (const auto& t : ctx.targets) tcp |= t.target.rfind("tcp:", 0) == 0;
  ctx.progress->Case("socketpair ping-pong");
  ctx.unix_transport.socketpair_rtt = SocketpairPingPong(ctx, ctx.Iterations(20000, 2000));
  EchoServer server = StartEchoServer(ctx, tcp);
  for (const std::string& ep : server.endpoints) {
    bool is_tcp = ep.rfind("tcp:", 0) == 0;
    ctx.progress->Case("gRPC echo on " + ep);
    MeasureEcho(ctx, ep, is_tcp ? &ctx.tcp_transport : &ctx.unix_transport);
  }
  server.Stop();

  Table t;
  t.scenario = "transports";
  t.baseline_label = "bare";
  t.baseline_description = "bare transports between two processes, nothing of ferry's";
  AddTransportRows("unix", ctx.unix_transport, &t);
  if (ctx.tcp_transport.measured) AddTransportRows("tcp", ctx.tcp_transport, &t);
  t.notes = {
      "round trip = request written until reply read, one in flight; GB/s = 8 MiB / "
      "p50 round trip (1 GB = 1e9 B)",
      "gRPC: callback server reactor + sync client stream, ferry's message-size limits"};
  return {t};
}

// --- worker modes -------------------------------------------------------------------------

int EchoServerMain(const std::vector<std::string>& args) {
  std::vector<std::string> listen;
  std::string ready;
  for (size_t i = 0; i + 1 < args.size(); i += 2) {
    if (args[i] == "--listen") listen.push_back(args[i + 1]);
    if (args[i] == "--ready-file") ready = args[i + 1];
  }
  // Block SIGTERM here so sigwait below receives it (threads gRPC starts inherit the mask).
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  // Never outlive ferry-bench, however it ends.
  prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (getppid() == 1) return 1;

  EchoService service;
  grpc::ServerBuilder builder;
  builder.SetMaxReceiveMessageSize(kServerMaxMessage);
  builder.SetMaxSendMessageSize(kServerMaxMessage);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  std::vector<int> ports(listen.size(), 0);
  for (size_t i = 0; i < listen.size(); ++i) {
    const std::string& ep = listen[i];
    if (ep.rfind("tcp:", 0) == 0) {
      builder.AddListeningPort(ep.substr(4), grpc::InsecureServerCredentials(), &ports[i]);
    } else {
      unlink(ep.substr(5).c_str());
      builder.AddListeningPort(ep, grpc::InsecureServerCredentials());
    }
  }
  builder.RegisterService(&service);
  auto server = builder.BuildAndStart();
  if (!server) {
    std::cerr << "echo-server: cannot listen\n";
    return 1;
  }
  std::string tmp = ready + ".tmp";
  {
    std::ofstream out(tmp);
    for (size_t i = 0; i < listen.size(); ++i) {
      if (listen[i].rfind("tcp:", 0) == 0) {
        std::string host = listen[i].substr(4, listen[i].rfind(':') - 4);
        out << "tcp:" << host << ":" << ports[i] << "\n";
      } else {
        out << listen[i] << "\n";
      }
    }
  }
  std::rename(tmp.c_str(), ready.c_str());
  int sig = 0;
  sigwait(&set, &sig);
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  // Leave without gRPC's static teardown, which was seen to hang for seconds here after
  // the client's connection went away; there is nothing left to flush.
  std::_Exit(0);
}

int PongWorkerMain() {
  // stdin is our end of the socketpair: echo every byte until EOF.
  char buf[4096];
  while (true) {
    ssize_t n = read(0, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return 0;
    if (!WriteAll(0, buf, static_cast<size_t>(n))) return 1;
  }
}

}  // namespace ferry::bench
