#include "engine/cuda/sm_partition.h"

#include "absl/strings/str_cat.h"

namespace ballast::engine::cuda {

// The driver's green-context calls, looked up at run time (the engine links
// the static runtime, not libcuda).
struct SmPartition::Driver {
  decltype(&cuDeviceGet) device_get = nullptr;
  decltype(&cuDeviceGetDevResource) get_resource = nullptr;
  decltype(&cuDevSmResourceSplitByCount) split = nullptr;
  decltype(&cuDevResourceGenerateDesc) describe = nullptr;
  decltype(&cuGreenCtxCreate) create = nullptr;
  decltype(&cuGreenCtxDestroy) destroy = nullptr;
  decltype(&cuGreenCtxStreamCreate) stream = nullptr;
};

namespace {

template <typename F>
absl::Status Lookup(const char* name, F* fn) {
  cudaDriverEntryPointQueryResult q;
  void* p = nullptr;
  if (cudaGetDriverEntryPointByVersion(name, &p, CUDA_VERSION, cudaEnableDefault, &q) !=
          cudaSuccess ||
      q != cudaDriverEntryPointSuccess || p == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("CUDA driver entry point ", name,
                     " not found (green contexts need a driver of CUDA 12.5 or later)"));
  }
  *fn = reinterpret_cast<F>(p);
  return absl::OkStatus();
}

absl::Status Check(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, " failed with CUresult ", static_cast<int>(r)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<SmPartition>> SmPartition::Create(int device, int sms, bool rest) {
  if (sms <= 0) return absl::InvalidArgumentError("an SM partition needs at least one SM");
  std::unique_ptr<SmPartition> p(new SmPartition());
  p->drv_ = std::make_unique<Driver>();
  Driver& d = *p->drv_;
  for (absl::Status st :
       {Lookup("cuDeviceGet", &d.device_get), Lookup("cuDeviceGetDevResource", &d.get_resource),
        Lookup("cuDevSmResourceSplitByCount", &d.split),
        Lookup("cuDevResourceGenerateDesc", &d.describe), Lookup("cuGreenCtxCreate", &d.create),
        Lookup("cuGreenCtxDestroy", &d.destroy), Lookup("cuGreenCtxStreamCreate", &d.stream)}) {
    if (!st.ok()) return st;
  }
  if (cudaSetDevice(device) != cudaSuccess || cudaFree(nullptr) != cudaSuccess) {
    return absl::UnavailableError(absl::StrCat("cannot initialise CUDA device ", device));
  }
  CUdevice dev = 0;
  CUdevResource all{}, first{}, left{};
  unsigned int groups = 1;
  if (auto st = Check(d.device_get(&dev, device), "cuDeviceGet"); !st.ok()) return st;
  if (auto st = Check(d.get_resource(dev, &all, CU_DEV_RESOURCE_TYPE_SM), "SM resource query");
      !st.ok()) {
    return st;
  }
  if (static_cast<unsigned>(sms) >= all.sm.smCount) {
    return absl::InvalidArgumentError(absl::StrCat("an SM partition of ", sms, " on device ",
                                                   device, " (", all.sm.smCount,
                                                   " SMs) leaves none for the rest"));
  }
  if (auto st =
          Check(d.split(&first, &groups, &all, &left, 0, static_cast<unsigned>(sms)), "SM split");
      !st.ok()) {
    return st;
  }
  CUdevResource* mine = rest ? &left : &first;
  if (groups != 1 || first.sm.smCount == 0 || left.sm.smCount == 0) {  // rounded up past it
    return absl::InvalidArgumentError(absl::StrCat("an SM partition of ", sms, " on device ",
                                                   device, " (", all.sm.smCount,
                                                   " SMs) leaves none for the rest"));
  }
  CUdevResourceDesc desc = nullptr;
  if (auto st = Check(d.describe(&desc, mine, 1), "SM resource descriptor"); !st.ok()) return st;
  if (auto st = Check(d.create(&p->ctx_, desc, dev, CU_GREEN_CTX_DEFAULT_STREAM),
                      "green context creation");
      !st.ok()) {
    return st;
  }
  p->sm_count_ = static_cast<int>(mine->sm.smCount);
  return p;
}

SmPartition::~SmPartition() {
  if (ctx_ != nullptr) drv_->destroy(ctx_);
}

absl::StatusOr<cudaStream_t> SmPartition::NewStream(int priority) {
  CUstream s = nullptr;
  if (auto st =
          Check(drv_->stream(&s, ctx_, CU_STREAM_NON_BLOCKING, priority), "green context stream");
      !st.ok()) {
    return st;
  }
  return static_cast<cudaStream_t>(s);
}

}  // namespace ballast::engine::cuda
