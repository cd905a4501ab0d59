#include "backend/cuda/stream_maker.h"

#include <pthread.h>

#include "backend/cuda/cuda_kernels.h"

namespace ferry::backend {

using cuda_internal::CublasApi;
using cuda_internal::CudaStatus;

Result<ReadyStream> MakeReadyStream() {
  ReadyStream ready;
  FERRY_RETURN_IF_ERROR(CudaStatus(cudaStreamCreateWithFlags(&ready.stream, cudaStreamNonBlocking),
                                   "cudaStreamCreateWithFlags"));
  // Stream-ordered, from the device's pool: cudaMalloc may wait for the whole device.
  Status allocated =
      CudaStatus(cudaMallocAsync(reinterpret_cast<void**>(&ready.reduce_partials),
                                 cuda_kernels::kReduceMaxBlocks * sizeof(double), ready.stream),
                 "cudaMallocAsync (reduction scratch)");
  if (!allocated.ok()) {
    (void)cudaStreamDestroy(ready.stream);
    (void)cudaGetLastError();
    return allocated;
  }
  return ready;
}

void DestroyReadyStream(ReadyStream ready) {
  if (ready.stream == nullptr) return;
  if (ready.cublas != nullptr) (void)ready.cublas_api->Destroy(ready.cublas);
  if (ready.cublas_workspace != nullptr) {
    (void)(ready.workspace_from_pool ? cudaFreeAsync(ready.cublas_workspace, ready.stream)
                                     : cudaFree(ready.cublas_workspace));
  }
  if (ready.reduce_partials != nullptr) (void)cudaFreeAsync(ready.reduce_partials, ready.stream);
  (void)cudaStreamDestroy(ready.stream);
  (void)cudaGetLastError();
}

StreamMaker::StreamMaker(int ordinal, size_t ahead) : ordinal_(ordinal), ahead_(ahead) {
  thread_ = std::thread([this] { Run(); });
}

StreamMaker::~StreamMaker() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  cv_.NotifyAll();
  thread_.join();
  if (cudaSetDevice(ordinal_) != cudaSuccess) (void)cudaGetLastError();
  MutexLock lock(&mu_);  // uncontended: the thread is gone (and the analysis skips destructors)
  for (const ReadyStream& ready : ready_) DestroyReadyStream(ready);
  for (const ReadyStream& closed : retired_) DestroyReadyStream(closed);
  for (cublasHandle_t handle : cublas_ready_) (void)cublas_api_->Destroy(handle);
  (void)cudaGetLastError();
}

std::optional<ReadyStream> StreamMaker::Take() {
  std::optional<ReadyStream> taken;
  {
    MutexLock lock(&mu_);
    if (ready_.empty()) return std::nullopt;
    taken = ready_.front();
    ready_.pop_front();
  }
  cv_.NotifyOne();
  return taken;
}

void StreamMaker::MakeCublasAhead(const CublasApi* api, cublasHandle_t made) {
  {
    MutexLock lock(&mu_);
    if (cublas_api_ == nullptr) cublas_api_ = api;
    if (made != nullptr && cublas_api_ == api && cublas_ready_.size() < kCublasAhead) {
      cublas_ready_.push_back(made);
      made = nullptr;
    }
  }
  if (made != nullptr) (void)api->Destroy(made);
  cv_.NotifyOne();
}

cublasHandle_t StreamMaker::TakeCublas() {
  cublasHandle_t taken = nullptr;
  {
    MutexLock lock(&mu_);
    if (cublas_ready_.empty()) return nullptr;
    taken = cublas_ready_.front();
    cublas_ready_.pop_front();
  }
  cv_.NotifyOne();
  return taken;
}

void StreamMaker::Retire(ReadyStream closed) {
  {
    MutexLock lock(&mu_);
    if (retired_.size() < kMaxRetired) {
      retired_.push_back(closed);
      cv_.NotifyOne();
      return;
    }
  }
  DestroyReadyStream(closed);
}

void StreamMaker::Run() {
  pthread_setname_np(pthread_self(), "ferry-streams");
  if (cudaSetDevice(ordinal_) != cudaSuccess) {
    (void)cudaGetLastError();
    return;  // nothing made ahead: sessions make their own streams
  }
  MutexLock lock(&mu_);
  while (true) {
    cv_.Wait(&mu_, [&] {
      mu_.AssertHeld();
      return stopping_ || !retired_.empty() || StreamWanted() || CublasWanted();
    });
    if (stopping_) return;
    if (!retired_.empty()) {
      std::vector<ReadyStream> closed;
      closed.swap(retired_);
      lock.Unlock();
      for (const ReadyStream& c : closed) DestroyReadyStream(c);
      lock.Lock();
      continue;
    }
    if (!StreamWanted()) {  // then a cuBLAS handle is wanted
      const CublasApi* api = cublas_api_;
      lock.Unlock();
      cublasHandle_t handle = nullptr;
      const bool created = api->Create(&handle) == CUBLAS_STATUS_SUCCESS;
      lock.Lock();
      if (created) {
        cublas_ready_.push_back(handle);
      } else {
        (void)cudaGetLastError();
        cublas_failed_ = true;  // sessions make their own and see the error
      }
      continue;
    }
    lock.Unlock();
    Result<ReadyStream> made = MakeReadyStream();
    lock.Lock();
    if (!made.ok()) {
      // A broken context: sessions make their own streams and see the error.
      failed_ = true;
      continue;
    }
    ready_.push_back(*made);
  }
}

}  // namespace ferry::backend
