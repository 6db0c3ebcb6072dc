// SM partitions (engine/cuda/sm_partition.h) on the GPU: a partition and
// the SMs left after it are disjoint and fit the device, and an executor
// whose steps run on a partition computes bitwise the same logits as one
// on the whole device (deterministic kernels: the attention plan, split
// over the partition's fewer SMs, keeps its reduction order), eagerly and
// through decode graphs.
#include <cuda_runtime_api.h>

#include <numeric>

#include "engine/cuda/sm_partition.h"
#include "gtest/gtest.h"
#include "tests/gpu/gpu_harness.h"
#include "tests/unit/engine/test_util.h"

namespace ballast::engine {
namespace {

TEST(SmPartition, APartitionAndTheRestAreDisjointAndFitTheDevice) {
  BALLAST_SKIP_WITHOUT_GPU();
  int sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  auto first = cuda::SmPartition::Create(0, 16, false);
  ASSERT_TRUE(first.ok()) << first.status();
  auto rest = cuda::SmPartition::Create(0, 16, true);
  ASSERT_TRUE(rest.ok()) << rest.status();
  EXPECT_GE((*first)->sm_count(), 16);
  EXPECT_GT((*rest)->sm_count(), 0);
  EXPECT_LE((*first)->sm_count() + (*rest)->sm_count(), sms);
  auto stream = (*first)->NewStream(0);
  ASSERT_TRUE(stream.ok()) << stream.status();
  EXPECT_EQ(cudaStreamSynchronize(*stream), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(*stream), cudaSuccess);
  EXPECT_FALSE(cuda::SmPartition::Create(0, sms, true).ok()) << "no SMs are left for the rest";
  EXPECT_FALSE(cuda::SmPartition::Create(0, 0, false).ok());
}

TEST(SmPartition, AnExecutorOnAPartitionComputesTheSameLogits) {
  BALLAST_SKIP_WITHOUT_GPU();
  testing::TempDir dir;
  const std::string path = testing::WriteTinyModel(dir, "m", testing::GpuTestModelSpec());
  testing::GpuHarness whole(path, 16, "auto", true, 2048, 512, WeightQuant::kNone, true);
  testing::GpuHarness part(path, 16, "auto", true, 2048, 512, WeightQuant::kNone, true, 16);
  std::vector<int> prompt(96);
  std::iota(prompt.begin(), prompt.end(), 3);
  for (int chunk : {32, 1}) {  // prefill chunks; then one token a step (graphs)
    const std::vector<float> want = whole.PromptLogits(prompt, chunk);
    const std::vector<float> got = part.PromptLogits(prompt, chunk);
    ASSERT_FALSE(want.empty());
    EXPECT_TRUE(got == want) << "chunk " << chunk;
  }
}

}  // namespace
}  // namespace ballast::engine
