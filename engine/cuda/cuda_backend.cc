// engine/gpu_backend.h for builds with CUDA.
#include <cuda_runtime_api.h>

#include <atomic>

#include "absl/strings/str_cat.h"
#include "engine/cuda/cuda_executor.h"
#include "engine/cuda/cuda_status.h"
#include "engine/gpu_backend.h"
#include "memory/host_block_pool.h"
#include "spdlog/spdlog.h"

namespace ballast::engine {
namespace {

// A HostBlockPool's bookkeeping over one cudaMalloc'd range it owns.
class GpuBlockPool final : public memory::BlockAllocator {
 public:
  GpuBlockPool(cuda::DeviceBuffer storage, std::unique_ptr<memory::HostBlockPool> pool)
      : storage_(std::move(storage)), pool_(std::move(pool)) {}
  absl::StatusOr<std::vector<memory::BlockId>> Allocate(int n) override {
    return pool_->Allocate(n);
  }
  // Checked like HostBlockPool::Free (all or nothing, every build type).
  absl::Status Free(absl::Span<const memory::BlockId> blocks) override {
    return pool_->Free(blocks);
  }
  uint8_t* Address(memory::BlockId id) override { return pool_->Address(id); }
  size_t block_bytes() const override { return pool_->block_bytes(); }
  memory::BlockAddressing addressing() const override { return pool_->addressing(); }
  int64_t num_total() const override { return pool_->num_total(); }
  int64_t num_free() const override { return pool_->num_free(); }

 private:
  cuda::DeviceBuffer storage_;
  std::unique_ptr<memory::HostBlockPool> pool_;
};

}  // namespace

bool GpuBackendBuilt() { return true; }

absl::StatusOr<std::unique_ptr<Executor>> CreateGpuExecutor(const ModelConfig& config,
                                                            const std::string& model_dir,
                                                            KvCache* kv,
                                                            const GpuExecutorOptions& options) {
  auto e = cuda::CudaExecutor::Create(config, model_dir, kv, options);
  if (!e.ok()) return e.status();
  return std::unique_ptr<Executor>(std::move(*e));
}

int64_t GpuWeightBytes(const ModelConfig& config) {
  return cuda::DeviceWeights::Bytes(config, cuda::CudaExecutor::ActivationType(config));
}

absl::StatusOr<std::unique_ptr<memory::BlockAllocator>> CreateGpuBlockPool(int device,
                                                                           size_t block_bytes,
                                                                           int64_t num_blocks) {
  BALLAST_CUDA_RETURN(cudaSetDevice(device), "cudaSetDevice");
  cuda::DeviceBuffer buf;
  const size_t bytes = block_bytes * static_cast<size_t>(num_blocks);
  if (auto s = buf.Allocate(bytes, "KV pool"); !s.ok()) return s;
  BALLAST_CUDA_RETURN(cudaMemset(buf.get(), 0, bytes), "KV pool");
  auto pool = memory::HostBlockPool::CreateOver(buf.get<uint8_t>(), block_bytes, num_blocks);
  if (!pool.ok()) return pool.status();
  return std::unique_ptr<memory::BlockAllocator>(
      new GpuBlockPool(std::move(buf), std::move(*pool)));
}

std::shared_ptr<void> PinHostMemory(void* data, size_t bytes) {
  if (data == nullptr || bytes == 0) return nullptr;
  if (const cudaError_t err = cudaHostRegister(data, bytes, cudaHostRegisterDefault);
      err != cudaSuccess) {
    cudaGetLastError();  // clear it: an unpinned copy still works, slower
    static std::atomic<bool> warned{false};
    if (!warned.exchange(true)) {
      spdlog::warn("cudaHostRegister of {} bytes failed ({}): KV tier copies run unpinned", bytes,
                   cudaGetErrorString(err));
    }
    return nullptr;
  }
  return std::shared_ptr<void>(data, [](void* p) { cudaHostUnregister(p); });
}

absl::StatusOr<std::shared_ptr<HostArena>> CreatePinnedHostArena(int64_t bytes,
                                                                 size_t chunk_bytes) {
  HostArenaOptions o;
  o.bytes = bytes;
  o.chunk_bytes = chunk_bytes;
  HostSlabSource pinned{[](size_t n) -> absl::StatusOr<void*> {
                          void* p = nullptr;
                          BALLAST_CUDA_RETURN(cudaHostAlloc(&p, n, cudaHostAllocPortable),
                                              "cudaHostAlloc");
                          return p;
                        },
                        [](void* p) { cudaFreeHost(p); }};
  return HostArena::Create(o, std::move(pinned));
}

absl::StatusOr<std::pair<int64_t, int64_t>> GpuMemoryInfo(int device) {
  BALLAST_CUDA_RETURN(cudaSetDevice(device), "cudaSetDevice");
  size_t free_b = 0, total_b = 0;
  BALLAST_CUDA_RETURN(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
  return std::make_pair(static_cast<int64_t>(free_b), static_cast<int64_t>(total_b));
}

}  // namespace ballast::engine
