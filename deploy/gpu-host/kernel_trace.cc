// A device timeline for any CUDA process on the GPU host, which has `ncu`
// but no `nsys` (GPU-HOST.md): a CUPTI injection library. The CUDA driver
// loads it at cuInit when CUDA_INJECTION64_PATH names it, and it records
// every kernel's start and end on the device (CUPTI's concurrent-kernel
// activity, graph replays included) to a CSV file.
//
// Build and use (deploy/gpu-host/kernel-trace.sh does both):
//   g++ -O2 -shared -fPIC -o libkernel_trace.so kernel_trace.cc
//       -I$CUDA/include -L$CUDA/lib64 -lcupti -Wl,-rpath,$CUDA/lib64
//   CUDA_INJECTION64_PATH=$PWD/libkernel_trace.so
//       KERNEL_TRACE_OUT=/tmp/trace-%p.csv ballast serve ...
// KERNEL_TRACE_OUT: the file (`%p` becomes the process id; default
// kernel-trace-%p.csv). The file's first line maps CUPTI's clock to the
// wall clock: `# clock cupti_ns realtime_ns`. Then one line per kernel:
// `start_ns,end_ns,device,stream,correlation,grid,block,name` (name
// demangled, without its argument list). The records are written as
// CUPTI hands over its buffers (at least once a second) and at exit, so a
// process ended by SIGTERM through its own shutdown keeps them all.
// KERNEL_TRACE_API_US: also record the CUDA runtime and driver API calls
// that took at least this many microseconds on the host (a launch that
// blocked, a synchronising call), as comment lines
// `# api start_ns end_ns thread correlation name`, which the kernel
// summary skips; unset: no API records. CUPTI then records every API call
// (the threshold only filters what is written), which adds host time to
// each call.
//
// Thread-safety: CUPTI calls the buffer callbacks on its own thread; the
// file and the name cache are guarded by one mutex.
#include <cupti.h>
#include <cxxabi.h>

#include <unistd.h>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <mutex>
#include <string>
#include <unordered_map>

namespace {

constexpr size_t kBufferBytes = 8 << 20;

std::mutex mu;
FILE* out = nullptr;
std::unordered_map<const char*, std::string> names;  // CUPTI's name pointers are stable
uint64_t api_min_ns = 0;  // KERNEL_TRACE_API_US, in ns; 0: API records off

#define CUPTI_OR_DIE(call)                                                       \
  do {                                                                           \
    const CUptiResult r = (call);                                                \
    if (r != CUPTI_SUCCESS) {                                                    \
      const char* s = nullptr;                                                   \
      cuptiGetResultString(r, &s);                                               \
      std::fprintf(stderr, "kernel_trace: %s failed: %s\n", #call, s ? s : "?"); \
      std::abort();                                                              \
    }                                                                            \
  } while (0)

// The demangled name without its parameter list (templates kept).
const std::string& ShortName(const char* mangled) {
  auto it = names.find(mangled);
  if (it != names.end()) return it->second;
  int status = 0;
  char* d = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string n = status == 0 && d != nullptr ? d : mangled;
  std::free(d);
  for (const std::string anon : {"(anonymous namespace)::", "void "}) {
    for (size_t at = n.find(anon); at != std::string::npos; at = n.find(anon)) {
      if (anon == "void " && at != 0) break;  // the return type only
      n.erase(at, anon.size());
    }
  }
  int depth = 0;  // cut at the first '(' outside template brackets
  for (size_t i = 0; i < n.size(); ++i) {
    if (n[i] == '<') ++depth;
    if (n[i] == '>') --depth;
    if (n[i] == '(' && depth == 0 && i > 0) {
      n.resize(i);
      break;
    }
  }
  for (char& c : n) {
    if (c == ',') c = ';';  // the CSV's separator
  }
  return names.emplace(mangled, std::move(n)).first->second;
}

// One API call's record, if it took at least api_min_ns. REQUIRES: mu held.
void WriteApi(const CUpti_ActivityAPI* a) {
  if (a->end < a->start || a->end - a->start < api_min_ns) return;
  const char* name = nullptr;
  const CUpti_CallbackDomain domain = a->kind == CUPTI_ACTIVITY_KIND_RUNTIME
                                          ? CUPTI_CB_DOMAIN_RUNTIME_API
                                          : CUPTI_CB_DOMAIN_DRIVER_API;
  if (cuptiGetCallbackName(domain, a->cbid, &name) != CUPTI_SUCCESS || name == nullptr) name = "?";
  std::fprintf(out, "# api %llu %llu %u %u %s\n", static_cast<unsigned long long>(a->start),
               static_cast<unsigned long long>(a->end), a->threadId, a->correlationId, name);
}

void CUPTIAPI BufferRequested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = kBufferBytes;
  *max_records = 0;
}

void CUPTIAPI BufferCompleted(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  std::lock_guard<std::mutex> lock(mu);
  CUpti_Activity* record = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (out == nullptr) continue;
    if (record->kind == CUPTI_ACTIVITY_KIND_RUNTIME || record->kind == CUPTI_ACTIVITY_KIND_DRIVER) {
      WriteApi(reinterpret_cast<const CUpti_ActivityAPI*>(record));
      continue;
    }
    if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
    std::fprintf(out, "%llu,%llu,%u,%u,%u,%d,%d,%s\n", static_cast<unsigned long long>(k->start),
                 static_cast<unsigned long long>(k->end), k->deviceId, k->streamId,
                 k->correlationId, k->gridX * k->gridY * k->gridZ,
                 k->blockX * k->blockY * k->blockZ, ShortName(k->name).c_str());
  }
  size_t dropped = 0;
  cuptiActivityGetNumDroppedRecords(nullptr, 0, &dropped);
  if (dropped > 0 && out != nullptr) std::fprintf(out, "# dropped %zu\n", dropped);
  std::free(buffer);
}

void AtExit() {
  cuptiActivityFlushAll(1);
  std::lock_guard<std::mutex> lock(mu);
  if (out != nullptr) std::fclose(out);
  out = nullptr;
}

std::string OutPath() {
  const char* env = std::getenv("KERNEL_TRACE_OUT");
  std::string p = env != nullptr && *env != '\0' ? env : "kernel-trace-%p.csv";
  const size_t at = p.find("%p");
  if (at != std::string::npos) p.replace(at, 2, std::to_string(getpid()));
  return p;
}

}  // namespace

extern "C" int InitializeInjection() {
  // Read before the callbacks are registered (CUPTI's thread reads it).
  if (const char* us = std::getenv("KERNEL_TRACE_API_US"); us != nullptr && *us != '\0') {
    char* end = nullptr;
    const unsigned long long v = std::strtoull(us, &end, 10);
    if (end == us || *end != '\0') {
      std::fprintf(stderr, "kernel_trace: KERNEL_TRACE_API_US=%s is not a whole number\n", us);
      return 0;
    }
    api_min_ns = std::max<uint64_t>(1, v * 1000);
  }
  const std::string path = OutPath();
  out = std::fopen(path.c_str(), "w");
  if (out == nullptr) {
    std::fprintf(stderr, "kernel_trace: cannot write %s\n", path.c_str());
    return 0;
  }
  uint64_t cupti_ns = 0;
  cuptiGetTimestamp(&cupti_ns);
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  std::fprintf(out, "# clock %llu %lld\n", static_cast<unsigned long long>(cupti_ns),
               static_cast<long long>(ts.tv_sec) * 1000000000LL + ts.tv_nsec);
  CUPTI_OR_DIE(cuptiActivityRegisterCallbacks(BufferRequested, BufferCompleted));
  CUPTI_OR_DIE(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
  if (api_min_ns > 0) {
    CUPTI_OR_DIE(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME));
    CUPTI_OR_DIE(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_DRIVER));
  }
  CUPTI_OR_DIE(cuptiActivityFlushPeriod(1000));
  std::atexit(AtExit);
  return 1;
}
