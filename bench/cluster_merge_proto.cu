// Should B = 1's attention splits meet on a thread-block cluster? (Sixty-
// fifth session; docs/decoder.md "Where the issue stands"; run by
// bench/gpu_session65.sh step `proto`.)
//
// Today (bench/merge_proto.cu's variant T, item 273's model of it: 8.29 µs a
// layer) B = 1's 17 splits per kv head store their partials to global
// memory, count themselves on their group's counter, and the last to arrive
// loads the 17 partials back from the L2 and merges them: the atomic 0.74 µs
// and the merge 2.2-2.3 µs of a ~7.6 µs stage (item 236's stamps). On a
// cluster of C CTAs (one kv head's C splits) the splits could instead push
// their partials into rank 0's shared memory with st.async (each completing
// bytes on rank 0's mbarrier) and rank 0 merges from its own shared memory:
// no atomic, no L2 round trip for the partials. Rank 0's shared memory is
// only its attention's while it runs that instance (the kernel's tiles share
// one region), so every split first meets the others at a cluster barrier
// (rank 0 arrives once it has initialised its mbarrier; the others wait
// before pushing, by then usually satisfied).
//
// The model, `layers` times over: 8 x S split CTAs (a group a kv head) each
// wait for the previous layer's 128 consumers (o_proj), spend `work` ns (the
// split's in-SM phases), then hand over their partials; the group's merged
// row slice goes out as bf16 and the consumers poll for the 8 slices, load
// the row, spend `gemv` ns and count themselves done. Variants: T (global
// partials, a count, the last merges) and C (the cluster push). Both merge in
// split order, so the merged rows must agree to a bf16 rounding step.
//
// It also reports how many clusters of 2, 4, 8 and 16 CTAs fit at once with
// the B = 1 kernel's block (256 threads, 82,176 bytes of dynamic shared
// memory, 2 CTAs an SM): a cluster kernel is persistent over all its CTAs, so
// the decoder needs 264 CTAs in clusters.
//
// Prediction written before it ran: C at 8 splits shorter than T at 17 by
// 1.5-2.5 µs a layer (the atomic and the merge's ~1.1 µs first round trip
// gone, the merge over 8 not 17), if the grid keeps 264 CTAs in clusters of 8.
//
// Build and run: nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a
// bench/cluster_merge_proto.cu -o /tmp/cmp && /tmp/cmp
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "chain_model.h"
#include "cuda_timing.h"

constexpr int KERNEL_SMEM =
    82176; // the B = 1 short kernel's dynamic shared memory
// A split's partial for its group: 4 heads x 64 dims of output, 4 (max, sum).
constexpr int PART_FLOATS = GROUP * DIM + 2 * GROUP; // 264 floats, 1056 bytes

struct Buffers {
  float *opart;         // [S][HEADS][DIM]
  float2 *ml;           // [S][HEADS]
  __nv_bfloat16 *row;   // the merged row
  __nv_bfloat16 *check; // the row as consumer 0 saw it, last layer
  unsigned *counters;   // per layer: group counts [8], attended, done
  unsigned *failed;
  float *sink;
};
constexpr int WORDS_PER_LAYER = KV_HEADS + 2;

// The merge of (head, dim) from `splits` partials laid out as [s][PART_FLOATS]
// (outputs [GROUP][DIM], then (max, sum) pairs), in split order.
template <class Load>
__device__ float merge_from(Load load, int splits, int gh, int dim) {
  float m[MAX_SPLITS], l[MAX_SPLITS], o[MAX_SPLITS];
#pragma unroll
  for (int s = 0; s < MAX_SPLITS; ++s)
    if (s < splits) {
      m[s] = load(s, GROUP * DIM + 2 * gh);
      l[s] = load(s, GROUP * DIM + 2 * gh + 1);
      o[s] = load(s, gh * DIM + dim);
    }
  float mx = -INFINITY;
#pragma unroll
  for (int s = 0; s < MAX_SPLITS; ++s)
    if (s < splits)
      mx = fmaxf(mx, m[s]);
  float num = 0.f, den = 0.f;
#pragma unroll
  for (int s = 0; s < MAX_SPLITS; ++s)
    if (s < splits) {
      float w = __expf(m[s] - mx);
      num += w * o[s];
      den += w * l[s];
    }
  return num / den;
}

__device__ unsigned smem_addr(const void *p) {
  return unsigned(__cvta_generic_to_shared(p));
}

// The consumers' side, the same in both variants.
__device__ void consume(const Buffers &b, float *x, int j, int layer,
                        int layers, unsigned *attended, unsigned *done,
                        unsigned gemv_cycles) {
  const int t = threadIdx.x;
  if (t == 0)
    poll_acquire(attended, KV_HEADS, b.failed);
  __syncthreads();
  load_row(b.row, x);
  consume_row(x, b.check, b.sink, j, layer, layers, done, gemv_cycles);
}

// T: today's global hand-over (bench/merge_proto.cu's T, partials laid out
// per split as PART_FLOATS so both variants merge the same numbers).
__global__ void __launch_bounds__(THREADS, 2)
    chain_global(Buffers b, int splits, int layers, unsigned work_cycles,
                 unsigned gemv_cycles) {
  extern __shared__ float x[]; // ROW floats used; sized as the kernel's
  __shared__ int last;
  const int cta = blockIdx.x, t = threadIdx.x;
  const int split_ctas = KV_HEADS * splits;
  for (int layer = 0; layer < layers; ++layer) {
    unsigned *words = b.counters + layer * WORDS_PER_LAYER;
    unsigned *attended = words + KV_HEADS, *done = words + KV_HEADS + 1;
    if (cta < split_ctas) {
      const int g = cta / splits, s = cta % splits;
      if (t == 0 && layer > 0)
        poll_acquire(done - WORDS_PER_LAYER, CONSUMERS, b.failed);
      __syncthreads();
      spin(work_cycles);
      float *part = b.opart + (g * MAX_SPLITS + s) * PART_FLOATS;
      const int gh = t / DIM, dim = t % DIM;
      part[gh * DIM + dim] = partial_out(s, g * GROUP + gh, dim, layer);
      if (dim == 0) {
        float2 ml = partial_ml(s, g * GROUP + gh, layer);
        part[GROUP * DIM + 2 * gh] = ml.x;
        part[GROUP * DIM + 2 * gh + 1] = ml.y;
      }
      __syncthreads();
      if (t == 0) {
        __threadfence();
        last = atomicAdd(&words[g], 1u) == unsigned(splits - 1);
        __threadfence();
      }
      __syncthreads();
      if (last) {
        const float *parts = b.opart + g * MAX_SPLITS * PART_FLOATS;
        auto load = [&](int s, int i) {
          return __ldcg(parts + s * PART_FLOATS + i);
        };
        b.row[(g * GROUP + gh) * DIM + dim] =
            __float2bfloat16(merge_from(load, splits, gh, dim));
        __syncthreads();
        if (t == 0)
          notify(attended);
      }
    } else if (cta < split_ctas + CONSUMERS) {
      consume(b, x, cta - split_ctas, layer, layers, attended, done,
              gemv_cycles);
    }
  }
}

// C: the cluster's splits push their partials into rank 0's shared memory.
__global__ void __launch_bounds__(THREADS, 2)
    chain_cluster(Buffers b, int splits, int layers, unsigned work_cycles,
                  unsigned gemv_cycles) {
  extern __shared__ float x[]; // consumers: the row; rank 0: the partials
  __shared__ alignas(8) unsigned long long bar;
  const int cta = blockIdx.x, t = threadIdx.x;
  const int split_ctas = KV_HEADS * splits;
  unsigned rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  for (int layer = 0; layer < layers; ++layer) {
    unsigned *words = b.counters + layer * WORDS_PER_LAYER;
    unsigned *attended = words + KV_HEADS, *done = words + KV_HEADS + 1;
    if (cta < split_ctas) {
      const int g = cta / splits, s = int(rank);
      if (t == 0 && layer > 0)
        poll_acquire(done - WORDS_PER_LAYER, CONSUMERS, b.failed);
      __syncthreads();
      // Rank 0 takes the partials from here on: a fresh mbarrier expecting
      // the others' bytes, published to the cluster by the barrier's arrive.
      if (rank == 0 && t == 0) {
        asm volatile(
            "mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(&bar))
            : "memory");
        asm volatile(
            "mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(
                smem_addr(&bar)),
            "r"(unsigned((splits - 1) * PART_FLOATS * 4))
            : "memory");
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
      }
      asm volatile("barrier.cluster.arrive.release;" ::: "memory");
      spin(work_cycles);
      const int gh = t / DIM, dim = t % DIM;
      float o = partial_out(s, g * GROUP + gh, dim, layer);
      float2 ml = partial_ml(s, g * GROUP + gh, layer);
      asm volatile("barrier.cluster.wait.acquire;" ::: "memory");
      float *slot = x + s * PART_FLOATS;
      if (rank == 0) {
        slot[gh * DIM + dim] = o;
        if (dim == 0) {
          slot[GROUP * DIM + 2 * gh] = ml.x;
          slot[GROUP * DIM + 2 * gh + 1] = ml.y;
        }
        // Wait for the others' bytes (phase 0 of the fresh barrier).
        unsigned ok = 0;
        for (long long polls = 0; !ok; ++polls) {
          asm volatile("{\n .reg .pred p;\n"
                       " mbarrier.try_wait.parity.acquire.cluster.shared::cta."
                       "b64 p, [%1], 0;\n selp.u32 %0, 1, 0, p;\n}"
                       : "=r"(ok)
                       : "r"(smem_addr(&bar))
                       : "memory");
          if (polls > MAX_POLLS) {
            atomicExch(b.failed, 1u);
            break;
          }
        }
        __syncthreads();
        if (t == 0) // done with it: the next layer initialises it afresh
          asm volatile(
              "mbarrier.inval.shared::cta.b64 [%0];" ::"r"(smem_addr(&bar))
              : "memory");
        auto load = [&](int s, int i) { return x[s * PART_FLOATS + i]; };
        b.row[(g * GROUP + gh) * DIM + dim] =
            __float2bfloat16(merge_from(load, splits, gh, dim));
        __syncthreads();
        if (t == 0)
          notify(attended);
      } else {
        unsigned remote, remote_bar;
        asm volatile("mapa.shared::cluster.u32 %0, %1, 0;"
                     : "=r"(remote)
                     : "r"(smem_addr(slot)));
        asm volatile("mapa.shared::cluster.u32 %0, %1, 0;"
                     : "=r"(remote_bar)
                     : "r"(smem_addr(&bar)));
        asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes."
                     "f32 [%0], %1, [%2];" ::"r"(remote + 4 * (gh * DIM + dim)),
                     "f"(o), "r"(remote_bar)
                     : "memory");
        if (dim == 0)
          asm volatile(
              "st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.f32 "
              "[%0], {%1, %2}, [%3];" ::"r"(remote +
                                            4 * (GROUP * DIM + 2 * gh)),
              "f"(ml.x), "f"(ml.y), "r"(remote_bar)
              : "memory");
      }
    } else if (cta < split_ctas + CONSUMERS) {
      consume(b, x, cta - split_ctas, layer, layers, attended, done,
              gemv_cycles);
    }
  }
  // No CTA may leave while a peer can still write its shared memory.
  asm volatile("barrier.cluster.arrive.release;\n"
               "barrier.cluster.wait.acquire;" ::
                   : "memory");
}

// A launch of `ctas` CTAs as the B = 1 kernel's block, in clusters of
// `cluster` (1: none); `attr` must outlive the config.
cudaLaunchConfig_t launch_config(int ctas, int cluster,
                                 cudaLaunchAttribute *attr) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(ctas);
  config.blockDim = dim3(THREADS);
  config.dynamicSmemBytes = KERNEL_SMEM;
  attr->id = cudaLaunchAttributeClusterDimension;
  attr->val.clusterDim.x = cluster;
  attr->val.clusterDim.y = attr->val.clusterDim.z = 1;
  config.attrs = attr;
  config.numAttrs = cluster > 1 ? 1 : 0;
  return config;
}

template <class K>
float run(K kernel, const Buffers &b, int ctas, int cluster, int splits,
          int layers, unsigned work_cycles, unsigned gemv_cycles,
          size_t words) {
  cudaLaunchAttribute attr;
  cudaLaunchConfig_t config = launch_config(ctas, cluster, &attr);
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  std::vector<float> us;
  for (int rep = 0; rep < 35; ++rep) {
    CHECK(cudaMemsetAsync(b.counters, 0, words * sizeof(unsigned)));
    CHECK(cudaEventRecord(e0));
    CHECK(cudaLaunchKernelEx(&config, kernel, b, splits, layers, work_cycles,
                             gemv_cycles));
    CHECK(cudaEventRecord(e1));
    CHECK(cudaEventSynchronize(e1));
    float ms;
    CHECK(cudaEventElapsedTime(&ms, e0, e1));
    if (rep >= 5)
      us.push_back(ms * 1000.f / layers);
  }
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

int main(int argc, char **argv) {
  int layers = 64;
  if (argc > 1)
    layers = std::atoi(argv[1]);
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  int khz = 0;
  CHECK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0));
  auto cycles = [&](unsigned ns) { return unsigned(ns * (khz / 1e6)); };
  for (auto k : {chain_global, chain_cluster}) {
    CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               KERNEL_SMEM));
    CHECK(cudaFuncSetAttribute(
        k, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  }
  int per_sm = 0;
  CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, chain_cluster,
                                                      THREADS, KERNEL_SMEM));
  std::printf("%s: %d SMs, %d CTAs an SM (256 threads, %d B dynamic shared)\n",
              prop.name, prop.multiProcessorCount, per_sm, KERNEL_SMEM);
  int fits[17] = {}; // CTAs co-resident in clusters of c
  fits[1] = per_sm * prop.multiProcessorCount;
  for (int c : {2, 4, 8, 16}) {
    cudaLaunchAttribute attr;
    cudaLaunchConfig_t config = launch_config(c * 64, c, &attr);
    int clusters = 0;
    cudaError_t e =
        cudaOccupancyMaxActiveClusters(&clusters, chain_cluster, &config);
    std::printf("clusters of %2d: %s%d at once = %d CTAs\n", c,
                e == cudaSuccess ? "" : "(query failed) ", clusters,
                clusters * c);
    fits[c] = e == cudaSuccess ? clusters * c : 0;
    cudaGetLastError();
  }
  Buffers b;
  CHECK(cudaMalloc(&b.opart, KV_HEADS * MAX_SPLITS * PART_FLOATS * 4));
  CHECK(cudaMalloc(&b.ml, MAX_SPLITS * HEADS * sizeof(float2)));
  CHECK(cudaMalloc(&b.row, ROW * sizeof(__nv_bfloat16)));
  CHECK(cudaMalloc(&b.check, ROW * sizeof(__nv_bfloat16)));
  const size_t words = size_t(layers) * WORDS_PER_LAYER;
  CHECK(cudaMalloc(&b.counters, words * sizeof(unsigned)));
  CHECK(cudaMalloc(&b.failed, sizeof(unsigned)));
  CHECK(cudaMalloc(&b.sink, CONSUMERS * sizeof(float)));
  CHECK(cudaMemset(b.failed, 0, sizeof(unsigned)));
  // (variant, splits, work ns): a split's in-SM time grows with its span
  // (64 positions at 17 splits, 128 at 8, 256 at 4); two guesses for each.
  struct Case {
    bool cluster;
    int splits;
    unsigned work_ns;
  };
  const unsigned gemv_ns = 1000;
  std::vector<Case> cases = {
      {false, 17, 1800}, {false, 8, 1800},  {true, 8, 1800}, {false, 8, 2400},
      {true, 8, 2400},   {false, 4, 2400},  {true, 4, 2400}, {false, 4, 3600},
      {true, 4, 3600},   {false, 16, 1800}, {true, 16, 1800}};
  std::vector<uint16_t> reference(ROW), got(ROW);
  for (const Case &c : cases) {
    const int ctas = KV_HEADS * c.splits + CONSUMERS;
    if (ctas >
        fits[c.cluster ? c.splits : 1]) { // a persistent model needs them all
      std::printf("%-8s splits %2d: %d CTAs do not fit at once; skipped\n",
                  c.cluster ? "cluster" : "global", c.splits, ctas);
      continue;
    }
    CHECK(cudaMemset(b.check, 0, ROW * 2));
    float us = c.cluster
                   ? run(chain_cluster, b, ctas, c.splits, c.splits, layers,
                         cycles(c.work_ns), cycles(gemv_ns), words)
                   : run(chain_global, b, ctas, 1, c.splits, layers,
                         cycles(c.work_ns), cycles(gemv_ns), words);
    cudaError_t e = cudaGetLastError();
    unsigned failed;
    CHECK(cudaMemcpy(&failed, b.failed, sizeof failed, cudaMemcpyDeviceToHost));
    std::printf("%-8s splits %2d work %4u ns: ",
                c.cluster ? "cluster" : "global", c.splits, c.work_ns);
    if (e != cudaSuccess || failed) {
      std::printf("failed (%s%s)\n", cudaGetErrorString(e),
                  failed ? ", a wait gave up" : "");
      CHECK(cudaMemset(b.failed, 0, sizeof(unsigned)));
      continue;
    }
    CHECK(cudaMemcpy(got.data(), b.check, ROW * 2, cudaMemcpyDeviceToHost));
    // The global variant at the same splits is the reference for the cluster's.
    int worst = 0;
    if (c.cluster)
      for (int i = 0; i < ROW; ++i)
        worst = std::max(worst, std::abs(int(reference[i]) - int(got[i])));
    else
      reference = got;
    std::printf("%6.2f us a layer%s\n", us,
                c.cluster ? (worst > 1 ? "  ROWS DIFFER" : "  (rows agree)")
                          : "");
  }
  std::printf("gemv %u ns a consumer, %d layers, %d MHz\n", gemv_ns, layers,
              khz / 1000);
  return 0;
}
