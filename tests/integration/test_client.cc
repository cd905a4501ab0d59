// A small client program for tests that need a separate process: it opens a session,
// queues work, and then (mode "hang") waits to be killed, or (mode "exit") exits without
// closing.
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "ferry/client.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s TARGET hang|exit\n", argv[0]);
    return 2;
  }
  auto client = ferry::Client::connect(argv[1]);
  if (!client.ok()) return 1;
  auto session = client->open_session();
  if (!session.ok()) return 1;
  ferry::Tensor a = session->create_tensor<double>({1 << 16});
  ferry::Tensor b = session->create_tensor<double>({1 << 16});
  session->fill(a, 1.0);
  if (!session->synchronize().ok()) return 1;
  for (int i = 0; i < 100; ++i) {
    session->axpy(0.5, a, b);
    if (!session->submit().ok()) return 1;
  }
  if (std::strcmp(argv[2], "exit") == 0) _exit(0);
  for (;;) pause();
}
