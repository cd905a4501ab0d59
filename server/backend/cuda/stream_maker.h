// StreamMaker: makes CUDA streams ahead for the next sessions and destroys closed sessions'
// streams, on a thread of its own (one per CudaDevice, when CudaDeviceOptions::streams_ahead
// is above 0), so that neither is on a session's open or close path; and ReadyStream, a
// stream with its scratch as it is handed over.
//
// Thread-safety: every public method is safe from any thread; one lock guards the maker's
// queues and is never held across a CUDA call but in the destructor, after the thread is
// gone. Ownership: a ReadyStream taken (Take) belongs to the taker; one handed to Retire
// belongs to the maker, which destroys it. Lifetime: the owner (CudaDevice) destroys the maker
// before its CompletionWatcher and after every stream of the device: the destructor joins the
// thread and destroys what was made and not taken, and what was retired.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <deque>
#include <optional>
#include <thread>
#include <vector>

#include "backend/cuda/cuda_internal.h"
#include "ferry/mutex.h"

namespace ferry::backend {

/// A session's CUDA stream and its reduction scratch (cuda_kernels::kReduceMaxBlocks doubles,
/// allocated on it): what a session's open would otherwise make with
/// cudaStreamCreateWithFlags and cudaMallocAsync, most of a session's creation
/// (docs/performance.md).
struct ReadyStream {
  cudaStream_t stream = nullptr;
  double* reduce_partials = nullptr;
  // A closed session's cuBLAS handle and workspace, when it ran a GEMM (DestroyReadyStream):
  // cublasDestroy waits for the whole device, and so does cudaFree of a workspace made with
  // cudaMalloc (one made inside a graph capture), so neither is left for a closing thread.
  cublasHandle_t cublas = nullptr;
  const cuda_internal::CublasApi* cublas_api = nullptr;
  void* cublas_workspace = nullptr;
  bool workspace_from_pool = false;
};

/// Make a non-blocking stream and its scratch on the current device.
Result<ReadyStream> MakeReadyStream();

/// Release a stream's scratch (in its order, unless null) and destroy the stream; on the
/// current device. Harmless on a dead context.
void DestroyReadyStream(ReadyStream ready);

/// Makes streams ahead for the next sessions and destroys closed sessions' streams, on a
/// thread of its own, so that neither is on an open's or a close's path. Once cuBLAS is open
/// (MakeCublasAhead), it also keeps kCublasAhead cuBLAS handles made for sessions' first
/// GEMMs: cublasCreate allocates device memory, which CUDA may make wait for the whole
/// device, and a session's first GEMM was seen waiting for another session's work on the
/// H200 (docs/architecture.md, "What an open and a close cost"). Only fresh
/// streams are handed out, in the order they were made, never one another session used:
/// CUDA gives a stream its hardware work queue when the stream is made (round robin), so a
/// session gets the queue a stream made at its open would have had (reused streams of
/// earlier sessions were tried and shared queues: docs/architecture.md).
class StreamMaker {
 public:
  /// Start the thread, which keeps `ahead` streams made on device `ordinal`.
  StreamMaker(int ordinal, size_t ahead);
  /// Joins the thread; destroys the streams made and not taken, and those retired.
  ~StreamMaker();

  StreamMaker(const StreamMaker&) = delete;
  StreamMaker& operator=(const StreamMaker&) = delete;

  /// The oldest stream made ahead, or nothing when none is ready (or making failed).
  std::optional<ReadyStream> Take();

  /// From now on keep kCublasAhead handles of `api` made (idempotent). `made`, when not
  /// null, is a handle of `api` made by the caller, kept as the first of them (else
  /// destroyed).
  void MakeCublasAhead(const cuda_internal::CublasApi* api, cublasHandle_t made = nullptr);

  /// A cuBLAS handle made ahead (on this device, no stream set), or null when none is ready.
  cublasHandle_t TakeCublas();

  /// Destroy `closed` (drained: nothing enqueued on it) on the maker's thread; at once on
  /// the caller's when kMaxRetired are already waiting.
  void Retire(ReadyStream closed);

 private:
  static constexpr size_t kMaxRetired = 64;
  static constexpr size_t kCublasAhead = 2;

  // What the loop makes next: streams first, then cuBLAS handles.
  bool StreamWanted() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !failed_ && ready_.size() < ahead_;
  }
  bool CublasWanted() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return cublas_api_ != nullptr && !cublas_failed_ && cublas_ready_.size() < kCublasAhead;
  }

  /// The thread: destroys what was retired, then makes what is wanted (the lock dropped
  /// while it makes or destroys), until stopped.
  void Run();

  const int ordinal_;
  const size_t ahead_;
  Mutex mu_;
  CondVar cv_;
  std::deque<ReadyStream> ready_ ABSL_GUARDED_BY(mu_);     // made, oldest first
  std::vector<ReadyStream> retired_ ABSL_GUARDED_BY(mu_);  // closed, to destroy
  bool failed_ ABSL_GUARDED_BY(mu_) = false;
  const cuda_internal::CublasApi* cublas_api_ ABSL_GUARDED_BY(mu_) = nullptr;  // once open
  std::deque<cublasHandle_t> cublas_ready_ ABSL_GUARDED_BY(mu_);               // made, oldest first
  bool cublas_failed_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace ferry::backend
