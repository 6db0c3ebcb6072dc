#include "memory/cuda/cuda_page_pool.h"

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"

namespace ballast::memory {

struct CudaPagePool::Driver {
  decltype(&cuMemCreate) create = nullptr;
  decltype(&cuMemRelease) release = nullptr;
  decltype(&cuMemAddressReserve) reserve = nullptr;
  decltype(&cuMemAddressFree) address_free = nullptr;
  decltype(&cuMemMap) map = nullptr;
  decltype(&cuMemUnmap) unmap = nullptr;
  decltype(&cuMemSetAccess) set_access = nullptr;
  decltype(&cuMemGetAllocationGranularity) granularity = nullptr;
  CUmemAllocationProp prop{};
  CUmemAccessDesc access{};
};

namespace {

template <typename F>
absl::Status Lookup(const char* name, F* fn) {
  cudaDriverEntryPointQueryResult q;
  void* p = nullptr;
  if (cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
      q != cudaDriverEntryPointSuccess || p == nullptr) {
    return absl::UnavailableError(absl::StrCat("CUDA driver entry point ", name, " not found"));
  }
  *fn = reinterpret_cast<F>(p);
  return absl::OkStatus();
}

absl::Status Check(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return absl::OkStatus();
  if (r == CUDA_ERROR_OUT_OF_MEMORY)
    return absl::ResourceExhaustedError(absl::StrCat(what, ": out of device memory"));
  return absl::InternalError(absl::StrCat(what, " failed with CUresult ", static_cast<int>(r)));
}

}  // namespace

CudaPagePool::CudaPagePool(int device, size_t page_bytes, int64_t budget)
    : device_(device), page_bytes_(page_bytes), drv_(std::make_unique<Driver>()) {
  stats_.budget_bytes = budget;
}

absl::StatusOr<std::unique_ptr<CudaPagePool>> CudaPagePool::Create(int device, size_t page_bytes,
                                                                   int64_t budget_bytes) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count <= device) {
    return absl::UnavailableError(absl::StrCat("no CUDA device ", device));
  }
  if (cudaSetDevice(device) != cudaSuccess || cudaFree(nullptr) != cudaSuccess) {
    return absl::UnavailableError(absl::StrCat("cannot initialise CUDA device ", device));
  }
  std::unique_ptr<CudaPagePool> p(new CudaPagePool(device, page_bytes, budget_bytes));
  Driver& d = *p->drv_;
  for (absl::Status st : {Lookup("cuMemCreate", &d.create), Lookup("cuMemRelease", &d.release),
                          Lookup("cuMemAddressReserve", &d.reserve),
                          Lookup("cuMemAddressFree", &d.address_free), Lookup("cuMemMap", &d.map),
                          Lookup("cuMemUnmap", &d.unmap), Lookup("cuMemSetAccess", &d.set_access),
                          Lookup("cuMemGetAllocationGranularity", &d.granularity)}) {
    if (!st.ok()) return st;
  }
  d.prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  d.prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  d.prop.location.id = device;
  d.access.location = d.prop.location;
  d.access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  size_t g = 0;
  if (auto st = Check(d.granularity(&g, &d.prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), "granularity");
      !st.ok()) {
    return st;
  }
  if (page_bytes == 0 || page_bytes % g != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("page size ", page_bytes, " is not a multiple of the VMM granularity ", g));
  }
  p->granularity_ = g;
  return p;
}

CudaPagePool::~CudaPagePool() {
  absl::MutexLock lock(&mu_);
  for (auto& [addr, h] : mapped_) {
    drv_->unmap(reinterpret_cast<CUdeviceptr>(addr), page_bytes_);
    drv_->release(h);
  }
  for (auto h : pooled_) drv_->release(h);
  for (auto& [addr, n] : reservations_) drv_->address_free(reinterpret_cast<CUdeviceptr>(addr), n);
}

absl::StatusOr<uint8_t*> CudaPagePool::Reserve(size_t bytes) {
  if (bytes == 0 || bytes % page_bytes_ != 0) {
    return absl::InvalidArgumentError("reservation must be a positive multiple of the page size");
  }
  CUdeviceptr ptr = 0;
  if (auto st = Check(drv_->reserve(&ptr, bytes, page_bytes_, 0, 0), "cuMemAddressReserve");
      !st.ok())
    return st;
  absl::MutexLock lock(&mu_);
  reservations_.push_back({reinterpret_cast<uint8_t*>(ptr), bytes});
  return reinterpret_cast<uint8_t*>(ptr);
}

absl::StatusOr<unsigned long long> CudaPagePool::TakeHandle() {
  if (!pooled_.empty()) {
    const auto h = pooled_.back();
    pooled_.pop_back();
    return h;
  }
  CUmemGenericAllocationHandle h;
  ++calls_.create;
  if (auto st = Check(drv_->create(&h, page_bytes_, &drv_->prop, 0), "cuMemCreate"); !st.ok())
    return st;
  return static_cast<unsigned long long>(h);
}

absl::Status CudaPagePool::Prewarm(size_t bytes) {
  absl::MutexLock lock(&mu_);
  for (size_t done = 0; done < bytes; done += page_bytes_) {
    CUmemGenericAllocationHandle h;
    ++calls_.create;
    if (auto st = Check(drv_->create(&h, page_bytes_, &drv_->prop, 0), "cuMemCreate"); !st.ok())
      return st;
    pooled_.push_back(h);
  }
  return absl::OkStatus();
}

absl::Status CudaPagePool::Map(uint8_t* addr, size_t bytes) {
  absl::MutexLock lock(&mu_);
  if (stats_.mapped_bytes + static_cast<int64_t>(bytes) > stats_.budget_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("page pool: mapping ", bytes, " bytes would pass the budget"));
  }
  return MapLocked(addr, bytes);
}

absl::Status CudaPagePool::MapLocked(uint8_t* addr, size_t bytes) {
  std::vector<uint8_t*> done;
  absl::Status st;
  for (size_t off = 0; off < bytes && st.ok(); off += page_bytes_) {
    auto h = TakeHandle();
    if (!h.ok()) {
      st = h.status();
      break;
    }
    ++calls_.map;
    st = Check(drv_->map(reinterpret_cast<CUdeviceptr>(addr + off), page_bytes_, 0, *h, 0),
               "cuMemMap");
    if (!st.ok()) {
      pooled_.push_back(*h);
      break;
    }
    mapped_[addr + off] = *h;
    done.push_back(addr + off);
  }
  if (st.ok()) {
    ++calls_.set_access;
    st = Check(drv_->set_access(reinterpret_cast<CUdeviceptr>(addr), bytes, &drv_->access, 1),
               "cuMemSetAccess");
  }
  if (!st.ok()) {  // all or nothing
    for (uint8_t* p : done) {
      ++calls_.unmap;
      drv_->unmap(reinterpret_cast<CUdeviceptr>(p), page_bytes_);
      pooled_.push_back(mapped_[p]);
      mapped_.erase(p);
    }
    return st;
  }
  stats_.mapped_bytes += static_cast<int64_t>(bytes);
  ++stats_.map_calls;
  return absl::OkStatus();
}

void CudaPagePool::Unmap(uint8_t* addr, size_t bytes) {
  absl::MutexLock lock(&mu_);
  UnmapLocked(addr, bytes);
}

absl::Status CudaPagePool::Exchange(absl::Span<const PageRange> unmap,
                                    absl::Span<const PageRange> map) {
  absl::MutexLock lock(&mu_);
  return ExchangeRanges(
      stats_, unmap, map,
      [this](const PageRange& r)
          ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return MapLocked(r.addr, r.bytes); },
      [this](const PageRange& r)
          ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { UnmapLocked(r.addr, r.bytes); });
}

void CudaPagePool::UnmapLocked(uint8_t* addr, size_t bytes) {
  ++calls_.unmap;
  drv_->unmap(reinterpret_cast<CUdeviceptr>(addr), bytes);  // one call for the range
  for (size_t off = 0; off < bytes; off += page_bytes_) {
    auto it = mapped_.find(addr + off);
    if (it == mapped_.end()) continue;
    pooled_.push_back(it->second);  // kept for reuse, not released
    mapped_.erase(it);
  }
  stats_.mapped_bytes -= static_cast<int64_t>(bytes);
  ++stats_.unmap_calls;
}

void CudaPagePool::ReleasePooled() {
  absl::MutexLock lock(&mu_);
  for (auto h : pooled_) {
    ++calls_.release;
    drv_->release(h);
  }
  pooled_.clear();
}

void CudaPagePool::SetBudget(int64_t bytes) {
  absl::MutexLock lock(&mu_);
  stats_.budget_bytes = bytes;
}

PagePoolStats CudaPagePool::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

CudaDriverCalls CudaPagePool::driver_calls() const {
  absl::MutexLock lock(&mu_);
  return calls_;
}

}  // namespace ballast::memory
