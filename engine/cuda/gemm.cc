#include "engine/cuda/gemm.h"

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/graph_buckets.h"

namespace ballast::engine::cuda {
namespace {

// cuBLASLt is loaded at run time, not linked: its 94 KiB of static TLS
// would make every thread with a small stack (civetweb's, under
// prometheus-cpp) fail to start, and CPU-only hosts need not have it.
struct LtApi {
#define BALLAST_LT_FN(name) decltype(&::name) name = nullptr;
  BALLAST_LT_FN(cublasLtCreate)
  BALLAST_LT_FN(cublasLtDestroy)
  BALLAST_LT_FN(cublasLtMatmulDescCreate)
  BALLAST_LT_FN(cublasLtMatmulDescDestroy)
  BALLAST_LT_FN(cublasLtMatmulDescSetAttribute)
  BALLAST_LT_FN(cublasLtMatrixLayoutCreate)
  BALLAST_LT_FN(cublasLtMatrixLayoutDestroy)
  BALLAST_LT_FN(cublasLtMatmulPreferenceCreate)
  BALLAST_LT_FN(cublasLtMatmulPreferenceDestroy)
  BALLAST_LT_FN(cublasLtMatmulPreferenceSetAttribute)
  BALLAST_LT_FN(cublasLtMatmulAlgoGetHeuristic)
  BALLAST_LT_FN(cublasLtMatmulAlgoCheck)
  BALLAST_LT_FN(cublasLtMatmulAlgoConfigSetAttribute)
  BALLAST_LT_FN(cublasLtMatmul)
#undef BALLAST_LT_FN
  std::string error;
};

const LtApi& Lt() {
  static const LtApi* api = [] {
    auto* a = new LtApi();
    void* h = nullptr;
    for (const char* name : {"libcublasLt.so.13", "libcublasLt.so", BALLAST_CUBLASLT_PATH}) {
      h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (h != nullptr) break;
    }
    if (h == nullptr) {
      a->error = absl::StrCat("cannot load cuBLASLt (libcublasLt.so.13): ", dlerror());
      return a;
    }
#define BALLAST_LT_LOAD(name)                                     \
  a->name = reinterpret_cast<decltype(a->name)>(dlsym(h, #name)); \
  if (a->name == nullptr) a->error = absl::StrCat("cuBLASLt lacks " #name);
    BALLAST_LT_LOAD(cublasLtCreate)
    BALLAST_LT_LOAD(cublasLtDestroy)
    BALLAST_LT_LOAD(cublasLtMatmulDescCreate)
    BALLAST_LT_LOAD(cublasLtMatmulDescDestroy)
    BALLAST_LT_LOAD(cublasLtMatmulDescSetAttribute)
    BALLAST_LT_LOAD(cublasLtMatrixLayoutCreate)
    BALLAST_LT_LOAD(cublasLtMatrixLayoutDestroy)
    BALLAST_LT_LOAD(cublasLtMatmulPreferenceCreate)
    BALLAST_LT_LOAD(cublasLtMatmulPreferenceDestroy)
    BALLAST_LT_LOAD(cublasLtMatmulPreferenceSetAttribute)
    BALLAST_LT_LOAD(cublasLtMatmulAlgoGetHeuristic)
    BALLAST_LT_LOAD(cublasLtMatmulAlgoCheck)
    BALLAST_LT_LOAD(cublasLtMatmulAlgoConfigSetAttribute)
    BALLAST_LT_LOAD(cublasLtMatmul)
#undef BALLAST_LT_LOAD
    return a;
  }();
  return *api;
}

}  // namespace

struct Gemm::Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  // Heuristic algorithms still to be timed (tuning); empty once tuned, or
  // when there is nothing to choose.
  std::vector<cublasLtMatmulAlgo_t> candidates;
  Key bucket{};  // the plan's key with m rounded up to its row bucket
  ~Plan() {
    if (c) Lt().cublasLtMatrixLayoutDestroy(c);
    if (b) Lt().cublasLtMatrixLayoutDestroy(b);
    if (a) Lt().cublasLtMatrixLayoutDestroy(a);
    if (op) Lt().cublasLtMatmulDescDestroy(op);
  }
};

namespace {

absl::Status Check(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("cuBLASLt ", what, ": status ", static_cast<int>(s)));
}

// cuBLASLt's first `count` heuristic algorithms for the descriptors, with
// at most `workspace_bytes` of workspace.
absl::StatusOr<std::vector<cublasLtMatmulAlgo_t>> HeuristicList(
    cublasLtHandle_t handle, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t a,
    cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c, size_t workspace_bytes, int count,
    const std::string& what) {
  cublasLtMatmulPreference_t pref;
  Lt().cublasLtMatmulPreferenceCreate(&pref);
  Lt().cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                            &workspace_bytes, sizeof(workspace_bytes));
  std::vector<cublasLtMatmulHeuristicResult_t> results(static_cast<size_t>(std::max(count, 1)));
  int found = 0;
  const cublasStatus_t hs = Lt().cublasLtMatmulAlgoGetHeuristic(
      handle, op, a, b, c, c, pref, static_cast<int>(results.size()), results.data(), &found);
  Lt().cublasLtMatmulPreferenceDestroy(pref);
  if (hs != CUBLAS_STATUS_SUCCESS || found == 0) {
    return absl::InternalError(absl::StrCat("cuBLASLt has no algorithm for ", what,
                                            workspace_bytes == 0 ? " without workspace" : ""));
  }
  std::vector<cublasLtMatmulAlgo_t> algos;
  for (int i = 0; i < found; ++i) {
    const cublasLtMatmulHeuristicResult_t& r = results[static_cast<size_t>(i)];
    if (r.state == CUBLAS_STATUS_SUCCESS) algos.push_back(r.algo);
  }
  if (algos.empty()) {
    return absl::InternalError(absl::StrCat("cuBLASLt has no usable algorithm for ", what));
  }
  return algos;
}

// cuBLASLt's first heuristic algorithm for the descriptors. Batch-invariant:
// no workspace (so no split-K reduction buffer or stream-K fix-up), and one
// K split set explicitly.
absl::StatusOr<cublasLtMatmulAlgo_t> Heuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t op,
                                               cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                               cublasLtMatrixLayout_t c, size_t workspace_bytes,
                                               bool batch_invariant, const std::string& what) {
  auto list = HeuristicList(handle, op, a, b, c, batch_invariant ? 0 : workspace_bytes, 1, what);
  if (!list.ok()) return list.status();
  cublasLtMatmulAlgo_t algo = list->front();
  if (batch_invariant) {
    const int32_t one_split = 1;
    const uint32_t no_reduction = CUBLASLT_REDUCTION_SCHEME_NONE;
    absl::Status st =
        Check(Lt().cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM,
                                                        &one_split, sizeof(one_split)),
              "one K split (deterministic mode)");
    if (st.ok()) {
      st = Check(
          Lt().cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME,
                                                    &no_reduction, sizeof(no_reduction)),
          "no split-K reduction (deterministic mode)");
    }
    if (!st.ok()) return absl::InternalError(absl::StrCat(st.message(), " for ", what));
  }
  return algo;
}

}  // namespace

namespace {

// An algorithm's bytes, as tuned_ and warmed_ keep them.
std::array<uint64_t, 8> AlgoBytes(const cublasLtMatmulAlgo_t& algo) {
  std::array<uint64_t, 8> bytes{};
  static_assert(sizeof(bytes) == sizeof(algo.data));
  std::memcpy(bytes.data(), algo.data, sizeof(algo.data));
  return bytes;
}

// *algo = the bucket's winner (cublasLtMatmulAlgo_t's bytes) if `listed`
// has it; else *algo is left as it is.
void AdoptIfListed(const std::vector<cublasLtMatmulAlgo_t>& listed,
                   const std::array<uint64_t, 8>& winner, cublasLtMatmulAlgo_t* algo) {
  for (const cublasLtMatmulAlgo_t& a : listed) {
    if (std::memcmp(a.data, winner.data(), sizeof(a.data)) == 0) *algo = a;
  }
}

// Tuning (gemm.h) times products of up to kMaxTunedRows rows, bucketed by
// the decode graphs' row buckets: each graph gets the algorithm timed for
// its own rows.
constexpr int kMaxTunedRows = 2048;
constexpr int RowBucket(int m) { return GraphBucketTokens(m); }
// A bucket is its own bucket: ChooseAlgo's plan for a bucket asks for no
// further one.
static_assert(RowBucket(RowBucket(3)) == RowBucket(3) && RowBucket(RowBucket(300)) == 320 &&
              RowBucket(RowBucket(2049)) == RowBucket(2049));

// The FP8 scratch: E4M3 rows, then (256-byte aligned) their scales.
size_t Fp8ScalesOffset(int fp8_rows, int fp8_max_k) {
  return (static_cast<size_t>(fp8_rows) * fp8_max_k + 255) / 256 * 256;
}

}  // namespace

size_t Gemm::Fp8ScratchBytes(int fp8_rows, int fp8_max_k) {
  return Fp8ScalesOffset(fp8_rows, fp8_max_k) + static_cast<size_t>(fp8_rows) * sizeof(float);
}

absl::StatusOr<std::unique_ptr<Gemm>> Gemm::Create(const GemmOptions& o) {
  if (!Lt().error.empty()) return absl::UnavailableError(Lt().error);
  std::unique_ptr<Gemm> g(new Gemm());
  cublasLtHandle_t h;
  if (auto s = Check(Lt().cublasLtCreate(&h), "create"); !s.ok()) return s;
  g->handle_ = h;
  if (cudaMalloc(&g->workspace_, o.workspace_bytes) != cudaSuccess) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate the ", o.workspace_bytes, "-byte cuBLASLt workspace"));
  }
  g->workspace_bytes_ = o.workspace_bytes;
  g->skinny_max_m_ = o.batch_invariant ? 0 : std::min(o.skinny_max_m, kSkinnyGemmMaxM);
  g->skinny_fp8_max_m_ =
      o.batch_invariant ? 0 : std::min(o.skinny_fp8_max_m, kSkinnyFp8WeightsMaxM);
  g->skinny_mma_max_m_ = o.batch_invariant ? 0 : std::min(o.skinny_mma_max_m, kSkinnyMmaMaxM);
  g->skinny_mma_2byte_ = o.skinny_mma_2byte;
  g->batch_invariant_ = o.batch_invariant;
  g->tune_candidates_ = o.batch_invariant ? 0 : std::max(o.tune_candidates, 0);
  if (o.fp8_rows > 0 && o.fp8_max_k > 0) {
    if (auto s = g->fp8_x_.Allocate(Fp8ScratchBytes(o.fp8_rows, o.fp8_max_k), "FP8 activations");
        !s.ok()) {
      return s;
    }
    g->fp8_rows_ = o.fp8_rows;
    g->fp8_max_k_ = o.fp8_max_k;
  }
  return g;
}

Gemm::~Gemm() {
  plans_.clear();
  for (void* e : tune_events_) {
    if (e) cudaEventDestroy(static_cast<cudaEvent_t>(e));
  }
  if (workspace_) cudaFree(workspace_);
  if (handle_) Lt().cublasLtDestroy(static_cast<cublasLtHandle_t>(handle_));
}

absl::Status Gemm::SetScalePointers(Plan* p, const float* w_scale, const float* x_scale) {
  absl::Status s =
      Check(Lt().cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                                &w_scale, sizeof(w_scale)),
            "FP8 weight scales");
  if (!s.ok()) return s;
  return Check(Lt().cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                                   &x_scale, sizeof(x_scale)),
               "FP8 input scales");
}

absl::Status Gemm::ChooseAlgo(Plan* p, int m, int n, int k, ActType type, bool out_f32, bool fp8,
                              const float* w_scale, const float* x_scale) {
  const std::string what =
      absl::StrCat(fp8 ? "FP8 " : "", "[", m, " x ", k, "] x [", n, " x ", k, "]^T");
  if (batch_invariant_ && m != kInvariantRefRows) {
    // Every row count runs the algorithm chosen for the reference shape.
    auto ref = GetPlan(kInvariantRefRows, n, k, type, out_f32, fp8, w_scale, x_scale);
    if (!ref.ok()) return ref.status();
    p->algo = (*ref)->algo;
  } else if (batch_invariant_ || tune_candidates_ == 0 || m > kMaxTunedRows) {
    if (!batch_invariant_ && RowBucket(m) != m) {
      // The bucket's algorithm (gemm.h, "One algorithm per row bucket").
      auto ref = GetPlan(RowBucket(m), n, k, type, out_f32, fp8, w_scale, x_scale);
      if (ref.ok()) {  // else (no algorithm for the bucket) m's own pick
        p->algo = (*ref)->algo;
        if (CheckRuns(*p).ok()) return absl::OkStatus();
      }
    }
    auto algo = Heuristic(static_cast<cublasLtHandle_t>(handle_), p->op, p->a, p->b, p->c,
                          workspace_bytes_, batch_invariant_, what);
    if (!algo.ok()) return algo.status();
    p->algo = *algo;
  } else {  // tuning: the heuristic's first until the bucket is timed
    auto list = HeuristicList(static_cast<cublasLtHandle_t>(handle_), p->op, p->a, p->b, p->c,
                              workspace_bytes_, tune_candidates_, what);
    if (!list.ok()) return list.status();
    p->algo = list->front();
    if (auto won = tuned_.find(p->bucket); won != tuned_.end()) {
      AdoptIfListed(*list, won->second, &p->algo);
    } else if (list->size() > 1) {
      p->candidates = std::move(*list);
    }
  }
  if (!batch_invariant_) return absl::OkStatus();
  if (absl::Status s = CheckRuns(*p); !s.ok()) {
    return absl::InternalError(
        absl::StrCat("batch-invariant ", s.message(), " for ", what, " (deterministic mode)"));
  }
  return absl::OkStatus();
}

std::pair<Gemm::Key, std::array<uint64_t, 8>> Gemm::WarmKey(const Plan& p) {
  Key shape = p.bucket;
  std::get<0>(shape) = 0;
  return {shape, AlgoBytes(p.algo)};
}

absl::Status Gemm::CheckRuns(const Plan& p) const {
  cublasLtMatmulHeuristicResult_t check{};
  absl::Status s = Check(Lt().cublasLtMatmulAlgoCheck(static_cast<cublasLtHandle_t>(handle_), p.op,
                                                      p.a, p.b, p.c, p.c, &p.algo, &check),
                         "algorithm check");
  if (s.ok() && check.workspaceSize > workspace_bytes_) {
    s = absl::InternalError(absl::StrCat("cuBLASLt algorithm wants ", check.workspaceSize,
                                         " bytes of workspace, more than ", workspace_bytes_));
  }
  return s;
}

absl::StatusOr<Gemm::Plan*> Gemm::GetPlan(int m, int n, int k, ActType type, bool out_f32, bool fp8,
                                          const float* w_scale, const float* x_scale) {
  const Key key{m, n, k, static_cast<int>(type), out_f32, fp8};
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second.get();
  auto p = std::make_unique<Plan>();
  p->bucket = Key{RowBucket(m), n, k, static_cast<int>(type), out_f32, fp8};
  const cudaDataType_t act = type == ActType::kBF16 ? CUDA_R_16BF : CUDA_R_16F;
  const cudaDataType_t in = fp8 ? CUDA_R_8F_E4M3 : act;
  const cudaDataType_t out = out_f32 ? CUDA_R_32F : act;
  if (auto s = Check(Lt().cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc");
      !s.ok()) {
    return s;
  }
  // Column-major view: D[n x m] = W^T(op T of a k x n matrix) * X(k x m).
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  for (auto [attr, v] :
       {std::pair{CUBLASLT_MATMUL_DESC_TRANSA, &ta}, std::pair{CUBLASLT_MATMUL_DESC_TRANSB, &tb}}) {
    if (auto s =
            Check(Lt().cublasLtMatmulDescSetAttribute(p->op, attr, v, sizeof(*v)), "transpose");
        !s.ok()) {
      return s;
    }
  }
  if (fp8) {  // one scale per row of op(A) (output channel) and per column of B (token)
    // A cuBLASLt older than 12.9 refuses these modes: an error here, not
    // scalar scales (the first of each vector) silently.
    const int32_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    for (auto attr : {CUBLASLT_MATMUL_DESC_A_SCALE_MODE, CUBLASLT_MATMUL_DESC_B_SCALE_MODE}) {
      if (auto s = Check(Lt().cublasLtMatmulDescSetAttribute(p->op, attr, &mode, sizeof(mode)),
                         "FP8 per-row scales (needs cuBLASLt 12.9 or later)");
          !s.ok()) {
        return s;
      }
    }
    if (auto s = SetScalePointers(p.get(), w_scale, x_scale); !s.ok()) return s;
  }
  if (auto s = Check(Lt().cublasLtMatrixLayoutCreate(&p->a, in, k, n, k), "layout a"); !s.ok())
    return s;
  if (auto s = Check(Lt().cublasLtMatrixLayoutCreate(&p->b, in, k, m, k), "layout b"); !s.ok())
    return s;
  if (auto s = Check(Lt().cublasLtMatrixLayoutCreate(&p->c, out, n, m, n), "layout c"); !s.ok())
    return s;
  if (auto s = ChooseAlgo(p.get(), m, n, k, type, out_f32, fp8, w_scale, x_scale); !s.ok()) {
    return s;
  }
  if (!warming_ && !warmed_.empty() && warmed_.count(WarmKey(*p)) == 0) ++unwarmed_plans_;
  Plan* raw = p.get();
  plans_.emplace(key, std::move(p));
  return raw;
}

bool Gemm::UsesSkinny(int m, int k) const { return m <= skinny_max_m_ && SkinnyGemmSupports(m, k); }

bool Gemm::UsesSkinnyFp8Weights(int m, int k) const {
  return m <= skinny_fp8_max_m_ && SkinnyGemmFp8WeightsSupports(m, k);
}

bool Gemm::UsesSkinnyFor(const float* w_scale, int m, int k) const {
  return w_scale == nullptr ? UsesSkinny(m, k) : UsesSkinnyFp8Weights(m, k);
}

bool Gemm::MmaRows(int m, int k) const {
  return m > skinny_max_m_ && m <= skinny_mma_max_m_ && SkinnyMmaSupports(m, k);
}

bool Gemm::UsesSkinnyMma(const float* w_scale, int m, int k) const {
  // E4M3 weights here only where x is taken as it is (W8A16:
  // RunFp8Quantized has the W8A8 form).
  return MmaRows(m, k) && (w_scale == nullptr ? skinny_mma_2byte_ : m <= skinny_fp8_max_m_);
}

bool Gemm::UsesSkinnySiluMul(const float* w_scale, int m, int k) const {
  return UsesSkinnyMma(w_scale, m, k) || UsesSkinnyFor(w_scale, m, k);
}

namespace {

absl::Status SkinnyStatus(cudaError_t e, const char* what, int m, int k) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat(what, " (", m, " rows of depth ", k, "): ", cudaGetErrorString(e)));
}

}  // namespace

absl::Status Gemm::RunSkinnySiluMul(const void* x, const void* w_gate_up, void* y, int m, int inter,
                                    int k, ActType type, cudaStream_t stream,
                                    const SkinnyNormIn* norm_in, const float* w_scale) {
  if (m == 0) return absl::OkStatus();
  if (norm_in == nullptr && UsesSkinnyMma(w_scale, m, k)) {
    return SkinnyStatus(LaunchSkinnyMmaSiluMul(x, w_gate_up, y, m, inter, k, type, stream, w_scale),
                        "tensor-core skinny gate/up + SiLU", m, k);
  }
  if (!UsesSkinnyFor(w_scale, m, k)) {
    return absl::InternalError(absl::StrCat("skinny gate/up + SiLU: ", m, " rows of depth ", k,
                                            " are not a skinny product"));
  }
  return SkinnyStatus(
      LaunchSkinnyGemmSiluMul(x, w_gate_up, y, m, inter, k, type, stream, norm_in, w_scale),
      "skinny gate/up + SiLU", m, k);
}

absl::Status Gemm::RunSkinnyNormOut(const void* x, const void* w, int m, int n, int k,
                                    const SkinnyNormOut& out, ActType type, cudaStream_t stream,
                                    const float* w_scale) {
  if (m == 0) return absl::OkStatus();
  if (!UsesSkinnyFor(w_scale, m, k)) {
    return SkinnyStatus(cudaErrorInvalidValue, "skinny norm producer", m, k);
  }
  return SkinnyStatus(LaunchSkinnyGemmNormOut(x, w, m, n, k, out, type, stream, w_scale),
                      "skinny norm producer", m, k);
}

absl::Status Gemm::RunSkinnyRopeKv(const void* x, const void* w, int m, int k,
                                   const SkinnyNormIn* norm_in, const SkinnyRope& rope,
                                   ActType type, cudaStream_t stream, const float* w_scale) {
  if (m == 0) return absl::OkStatus();
  if (!UsesSkinnyFor(w_scale, m, k)) {
    return SkinnyStatus(cudaErrorInvalidValue, "skinny qkv + RoPE", m, k);
  }
  return SkinnyStatus(LaunchSkinnyGemmRopeKv(x, w, m, k, norm_in, rope, type, stream, w_scale),
                      "skinny qkv + RoPE", m, k);
}

absl::Status Gemm::RunSkinnyNormIn(const void* x, const void* w, void* y, int m, int n, int k,
                                   const SkinnyNormIn& in, ActType type, cudaStream_t stream,
                                   const float* w_scale) {
  if (m == 0) return absl::OkStatus();
  if (!UsesSkinnyFor(w_scale, m, k)) {
    return SkinnyStatus(cudaErrorInvalidValue, "skinny normed product", m, k);
  }
  return SkinnyStatus(LaunchSkinnyGemm(x, w, y, m, n, k, type, false, stream, &in, w_scale),
                      "skinny normed product", m, k);
}

absl::Status Gemm::Run(const void* x, const void* w, void* y, int m, int n, int k, ActType type,
                       bool out_f32, cudaStream_t stream) {
  if (m == 0) return absl::OkStatus();
  if (UsesSkinny(m, k)) {
    const cudaError_t e = LaunchSkinnyGemm(x, w, y, m, n, k, type, out_f32, stream);
    if (e != cudaSuccess)
      return absl::InternalError(absl::StrCat("skinny gemm: ", cudaGetErrorString(e)));
    return absl::OkStatus();
  }
  if (UsesSkinnyMma(nullptr, m, k)) {
    return SkinnyStatus(LaunchSkinnyMma(x, w, y, m, n, k, type, out_f32, stream),
                        "tensor-core skinny gemm", m, k);
  }
  auto plan = GetPlan(m, n, k, type, out_f32, false);
  if (!plan.ok()) return plan.status();
  return Launch(*plan, w, x, y, stream, "matmul");
}

int Gemm::Matmul(const Plan& p, const void* algo, const void* w, const void* x, void* y,
                 cudaStream_t stream) const {
  const float alpha = 1.0f, beta = 0.0f;
  return Lt().cublasLtMatmul(static_cast<cublasLtHandle_t>(handle_), p.op, &alpha, w, p.a, x, p.b,
                             &beta, y, p.c, y, p.c, static_cast<const cublasLtMatmulAlgo_t*>(algo),
                             workspace_, workspace_bytes_, stream);
}

absl::Status Gemm::Launch(Plan* p, const void* w, const void* x, void* y, cudaStream_t stream,
                          const char* what) {
  if (warming_) {
    if (!warmed_.insert(WarmKey(*p)).second) return absl::OkStatus();  // launched
  } else if (!p->candidates.empty()) {
    if (auto s = Tune(p, w, x, y, stream); !s.ok()) return s;
  }
  return Check(static_cast<cublasStatus_t>(Matmul(*p, &p->algo, w, x, y, stream)), what);
}

absl::Status Gemm::Tune(Plan* p, const void* w, const void* x, void* y, cudaStream_t stream) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  BALLAST_CUDA_RETURN(cudaStreamIsCapturing(stream, &capture), "GEMM tuning");
  if (capture != cudaStreamCaptureStatusNone) return absl::OkStatus();  // at an uncaptured call
  if (auto won = tuned_.find(p->bucket); won != tuned_.end()) {  // timed meanwhile, at another m
    AdoptIfListed(p->candidates, won->second, &p->algo);
    p->candidates.clear();
    return absl::OkStatus();
  }
  for (void*& e : tune_events_) {
    if (e == nullptr)
      BALLAST_CUDA_RETURN(cudaEventCreate(reinterpret_cast<cudaEvent_t*>(&e)), "GEMM tuning event");
  }
  const auto start = static_cast<cudaEvent_t>(tune_events_[0]);
  const auto stop = static_cast<cudaEvent_t>(tune_events_[1]);
  constexpr int kTimedRuns = 3;
  float best_ms = std::numeric_limits<float>::infinity();
  for (const cublasLtMatmulAlgo_t& a : p->candidates) {
    if (Matmul(*p, &a, w, x, y, stream) != CUBLAS_STATUS_SUCCESS) continue;  // untimed warm-up
    BALLAST_CUDA_RETURN(cudaEventRecord(start, stream), "GEMM tuning");
    bool ok = true;
    for (int r = 0; r < kTimedRuns; ++r)
      ok = ok && Matmul(*p, &a, w, x, y, stream) == CUBLAS_STATUS_SUCCESS;
    BALLAST_CUDA_RETURN(cudaEventRecord(stop, stream), "GEMM tuning");
    BALLAST_CUDA_RETURN(cudaEventSynchronize(stop), "GEMM tuning");
    float ms = 0;
    BALLAST_CUDA_RETURN(cudaEventElapsedTime(&ms, start, stop), "GEMM tuning");
    if (ok && ms < best_ms) {
      best_ms = ms;
      p->algo = a;
    }
  }
  tuned_.emplace(p->bucket, AlgoBytes(p->algo));
  p->candidates.clear();
  return absl::OkStatus();
}

absl::Status Gemm::CheckFp8Shape(int m, int k) const {
  if (m <= fp8_rows_ && k <= fp8_max_k_) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("FP8 gemm of [", m, " x ", k,
                                          "] exceeds the scratch sized for [", fp8_rows_, " x ",
                                          fp8_max_k_, "]"));
}

Fp8Rows Gemm::fp8_input() const {
  uint8_t* xq = fp8_x_.get<uint8_t>();
  if (xq == nullptr) return {};
  return {xq, reinterpret_cast<float*>(xq + Fp8ScalesOffset(fp8_rows_, fp8_max_k_))};
}

absl::Status Gemm::RunFp8(const void* x, const void* w, const float* w_scale, void* y, int m, int n,
                          int k, ActType type, cudaStream_t stream) {
  if (m == 0) return absl::OkStatus();
  if (UsesSkinnyMma(w_scale, m, k)) {  // x as it is (W8A16), on tensor cores
    return SkinnyStatus(LaunchSkinnyMma(x, w, y, m, n, k, type, false, stream, w_scale),
                        "tensor-core skinny FP8-weight gemm", m, k);
  }
  if (UsesSkinnyFp8Weights(m, k)) {  // x as it is (W8A16)
    return SkinnyStatus(LaunchSkinnyGemm(x, w, y, m, n, k, type, false, stream, nullptr, w_scale),
                        "skinny FP8-weight gemm", m, k);
  }
  if (auto st = CheckFp8Shape(m, k); !st.ok()) return st;
  const Fp8Rows in = fp8_input();
  const SrcType src = type == ActType::kBF16 ? SrcType::kBF16 : SrcType::kF16;
  if (const cudaError_t e = LaunchQuantizeRowsFp8(x, src, m, k, in.q, in.scale, stream);
      e != cudaSuccess) {
    return absl::InternalError(
        absl::StrCat("FP8 activation quantization: ", cudaGetErrorString(e)));
  }
  return RunFp8Quantized(w, w_scale, y, m, n, k, type, stream);
}

absl::Status Gemm::RunFp8Quantized(const void* w, const float* w_scale, void* y, int m, int n,
                                   int k, ActType type, cudaStream_t stream) {
  if (m == 0) return absl::OkStatus();
  if (auto st = CheckFp8Shape(m, k); !st.ok()) return st;
  const Fp8Rows in = fp8_input();
  const void* xq = in.q;
  float* x_scale = in.scale;
  if (MmaRows(m, k)) {
    return SkinnyStatus(LaunchSkinnyMmaFp8(xq, x_scale, w, w_scale, y, m, n, k, type, stream),
                        "tensor-core skinny FP8 gemm", m, k);
  }
  if (m <= skinny_max_m_ && SkinnyGemmFp8Supports(m, k)) {
    const cudaError_t e =
        LaunchSkinnyGemmFp8(xq, x_scale, w, w_scale, y, m, n, k, type, false, stream);
    if (e != cudaSuccess)
      return absl::InternalError(absl::StrCat("skinny FP8 gemm: ", cudaGetErrorString(e)));
    return absl::OkStatus();
  }
  auto plan = GetPlan(m, n, k, type, false, true, w_scale, x_scale);
  if (!plan.ok()) return plan.status();
  Plan* p = *plan;
  // The scale pointers change per weight; the descriptor is read at each call.
  if (auto s = SetScalePointers(p, w_scale, x_scale); !s.ok()) return s;
  return Launch(p, w, xq, y, stream, "FP8 matmul");
}

}  // namespace ballast::engine::cuda
