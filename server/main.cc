// ferryd: composition root. Parses flags, builds the device and the daemon, waits for a
// signal, drains. No logic here that a test would need.
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <spdlog/spdlog.h>

#include "backend/select.h"
#include "config.h"
#include "ferry/version.h"
#include "rpc/daemon.h"
#include "session/device_supervisor.h"

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  auto parsed = ferry::ParseFlags(args);
  if (!parsed.ok()) {
    std::cerr << "ferryd: " << parsed.status().message() << "\n(see ferryd --help)\n";
    return 2;
  }
  ferry::DaemonConfig config = std::move(*parsed);
  if (config.show_help) {
    std::cout << ferry::FlagsHelp();
    return 0;
  }
  if (config.show_version) {
    std::cout << "ferryd " << ferry::kVersion << " (" << ferry::kGitCommit << ")\n";
    return 0;
  }
  spdlog::set_level(spdlog::level::from_str(config.log_level));
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ ferryd[%P] %v");

  auto factory = ferry::backend::MakeDeviceFactory(config.backend, config.device, config.host,
                                                   config.host_fault_after_ops_for_test);
  if (!factory.ok()) {
    spdlog::critical("cannot open device {}: {}", config.device, factory.status().ToString());
    return 1;
  }
  auto device = ferry::session::DeviceSupervisor::Create(factory->create, factory->reset_context);
  if (!device.ok()) {
    spdlog::critical("cannot open device {}: {}", config.device, device.status().ToString());
    return 1;
  }
  const auto info = (*device)->info();
  spdlog::info("ferryd {} ({}): device {} '{}' on the {} backend ({})", ferry::kVersion,
               ferry::kGitCommit, info.ordinal, info.name, info.backend, factory->why);

  auto daemon = ferry::rpc::Daemon::Start(std::move(*device), config.daemon);
  if (!daemon.ok()) {
    spdlog::critical("cannot start: {}", daemon.status().ToString());
    return 1;
  }
  for (const auto& ep : (*daemon)->endpoints()) spdlog::info("listening on {}", ep);
  if (!config.ready_file.empty()) {
    std::string tmp = config.ready_file + ".tmp";
    {
      std::ofstream out(tmp);
      for (const auto& ep : (*daemon)->endpoints()) out << ep << "\n";
    }
    std::rename(tmp.c_str(), config.ready_file.c_str());
  }

  boost::asio::io_context signals_io;
  boost::asio::signal_set signals(signals_io, SIGINT, SIGTERM);
  signals.async_wait([&](const boost::system::error_code& ec, int sig) {
    if (!ec) spdlog::info("signal {}: draining (up to {} ms)", sig, config.drain_timeout.count());
  });
  (*daemon)->SetDrainHandler([&signals_io] {
    spdlog::info("drain requested through the Admin service");
    signals_io.stop();
  });
  signals_io.run();
  (*daemon)->Shutdown(config.drain_timeout);
  spdlog::info("stopped");
  return 0;
}
