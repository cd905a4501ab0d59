// The README's example: connect, open a session, compute on the GPU, read the result.
#include <ferry/client.h>

#include <cstdio>
#include <vector>

int main(int argc, char** argv) {
  auto client = ferry::Client::connect(argc > 1 ? argv[1] : "unix:/run/ferry/ferryd-0.sock");
  if (!client.ok()) return std::fprintf(stderr, "%s\n", client.status().ToString().c_str()), 1;
  ferry::Status status = client->with_session([](ferry::Session& s) -> ferry::Status {
    std::vector<float> x(1 << 20, 1.5f);
    ferry::Tensor a = s.create_tensor<float>({1 << 20});
    ferry::Tensor b = s.create_tensor<float>({1 << 20});
    ferry::Tensor total = s.create_tensor<float>({1});
    FERRY_RETURN_IF_ERROR(s.upload(a, x));  // blocking upload
    s.scale(a, 2.0, b);                     // recorded, not sent yet
    s.axpy(1.0, a, b);                      // b = 2a + a
    s.sum(b, total);
    auto sum = s.download<float>(total);  // one submit for the three ops, then the read
    if (!sum.ok()) return sum.status();
    std::printf("backend %s: sum = %.1f (expected %.1f)\n", s.backend().c_str(), (*sum)[0],
                4.5 * x.size());
    return (*sum)[0] == 4.5f * x.size() ? ferry::Status::Ok()
                                        : ferry::Status(ferry::ErrorKind::kInternal, "wrong sum");
  });
  if (!status.ok()) return std::fprintf(stderr, "%s\n", status.ToString().c_str()), 1;
  return 0;
}
