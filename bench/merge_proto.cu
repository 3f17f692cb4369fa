// Should B = 1's o_proj merge the attention's splits itself? (Sixtieth
// session, docs/decoder.md "Where the issue stands", lead 4; run by
// bench/gpu_session60.sh step `merge`.)
//
// At B = 1, L = 1024 the attention stage takes ~8-9 µs a layer with the HBM
// idle: 17 splits per kv head (8 kv heads, 4 query heads each, head dim 64)
// each store their partial output and softmax state, count themselves on
// their group's counter (fence + atomic), and the split that arrives last
// loads the group's 17 partials, merges them, stores its slice of the
// attention row (bf16) and notifies; o_proj's 128 instances poll for the 8
// merges and load the row (item 236's stamps: the atomic 0.74 µs, the merge
// 2.2-2.3 µs). The alternative: each split stores and notifies (no count),
// and every o_proj instance loads all 136 partials (139 KB from L2) and
// merges the whole row into its shared memory itself. One hand-off (the
// merged row's store, notify, poll and load) and the atomic leave the chain;
// each consumer's load grows from 4 KB to ~143 KB.
//
// A model of that chain, `layers` times over: 8 x S split CTAs (S = 17, or
// 9 as the B = 1 tier from L = 900), each waiting for the previous layer's
// consumers, spending `work` ns (the splits' in-SM phases), then storing its
// 4 x 64 partial outputs and (max, sum) pairs; 128 consumer CTAs, each
// waiting for the layer's attention, building the 2048-wide row in shared
// memory, spending `gemv` ns (o_proj's own time), then counting themselves
// done. Waits poll with ld.acquire.gpu and the decoder's nanosleep backoff
// (16 to 256 ns); notifies are a fence then a relaxed add, as the decoder's.
// Variants: T (today: count, last split merges, consumers load the row) and
// O (o_proj merges: consumers load every partial). Reported: µs a layer (the
// median launch over `layers`; CUDA events) and the largest difference
// between the two variants' merged rows (bf16 units), which must be 0 or 1
// rounding step: both merge in split order. Predicted before it ran: O
// shorter by 0.5-1.5 µs a layer at 17 splits (the atomic's ~0.74 and one
// hand-off's ~1.5 gone, against two or three round trips of partials where
// T's consumer has one of the row), and by less at 9 splits. Worth building
// into the tiles only past ~1 µs (16 layers: ~2 % of the B = 1 step).
//
// Build and run: nvcc -O3 -gencode arch=compute_90a,code=sm_90a
// bench/merge_proto.cu -o /tmp/mp && /tmp/mp
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "chain_model.h"
#include "cuda_timing.h"

struct Buffers {
  float *opart;         // [S][HEADS][DIM]
  float2 *ml;           // [S][HEADS] (max, sum)
  __nv_bfloat16 *row;   // T: the merged row
  __nv_bfloat16 *check; // the row as consumer 0 built it (both variants)
  unsigned *counters;   // per layer: group counts [8], attended, done
  unsigned *failed;
  float *sink; // [CONSUMERS]: what each consumer computed (kept live)
};

constexpr int WORDS_PER_LAYER = KV_HEADS + 2;

// The merge of one (head, dim) over `splits` partials, in split order.
__device__ float merge_one(const Buffers &b, int splits, int head, int dim) {
  float m[MAX_SPLITS], l[MAX_SPLITS], o[MAX_SPLITS];
#pragma unroll
  for (int s = 0; s < MAX_SPLITS; ++s)
    if (s < splits) {
      float2 x = __ldcg(&b.ml[s * HEADS + head]);
      m[s] = x.x;
      l[s] = x.y;
      o[s] = __ldcg(&b.opart[(s * HEADS + head) * DIM + dim]);
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

template <bool OPROJ_MERGES>
__global__ void __launch_bounds__(THREADS, 2)
    chain(Buffers b, int splits, int layers, unsigned work_cycles,
          unsigned gemv_cycles) {
  __shared__ float x[ROW];
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
      const int head = g * GROUP + t / DIM, dim = t % DIM;
      b.opart[(s * HEADS + head) * DIM + dim] =
          partial_out(s, head, dim, layer);
      if (dim == 0)
        b.ml[s * HEADS + head] = partial_ml(s, head, layer);
      __syncthreads();
      if (OPROJ_MERGES) {
        if (t == 0)
          notify(attended);
        continue;
      }
      if (t == 0) {
        __threadfence();
        last = atomicAdd(&words[g], 1u) == unsigned(splits - 1);
        __threadfence();
      }
      __syncthreads();
      if (last) {
        b.row[head * DIM + dim] =
            __float2bfloat16(merge_one(b, splits, head, dim));
        __syncthreads();
        if (t == 0)
          notify(attended);
      }
    } else if (cta < split_ctas + CONSUMERS) {
      const int j = cta - split_ctas;
      if (t == 0)
        poll_acquire(attended, OPROJ_MERGES ? split_ctas : KV_HEADS, b.failed);
      __syncthreads();
      // Thread t builds dims 8t..8t+7 of the row (one head's slice).
      if (OPROJ_MERGES) {
        // The softmax states first (one round trip), then the partial
        // outputs two 16-byte loads a split, as many in flight as the
        // registers hold (a whole row's 34 would spill): the same sums in
        // the same order as merge_one.
        const int head = 8 * t / DIM, d0 = (8 * t) % DIM;
        float m[MAX_SPLITS], w[MAX_SPLITS], mx = -INFINITY, den = 0.f;
#pragma unroll
        for (int s = 0; s < MAX_SPLITS; ++s)
          if (s < splits) {
            float2 v = __ldcg(&b.ml[s * HEADS + head]);
            m[s] = v.x;
            w[s] = v.y; // the sum until the weights are known
          }
#pragma unroll
        for (int s = 0; s < MAX_SPLITS; ++s)
          if (s < splits)
            mx = fmaxf(mx, m[s]);
#pragma unroll
        for (int s = 0; s < MAX_SPLITS; ++s)
          if (s < splits) {
            float l = w[s];
            w[s] = __expf(m[s] - mx);
            den += w[s] * l;
          }
        float num[8] = {};
        const float4 *o4 = reinterpret_cast<const float4 *>(b.opart);
#pragma unroll
        for (int s = 0; s < MAX_SPLITS; ++s) {
          if (s >= splits)
            break;
          const int at = ((s * HEADS + head) * DIM + d0) / 4;
          float4 lo = __ldcg(o4 + at), hi = __ldcg(o4 + at + 1);
          float o[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
          for (int e = 0; e < 8; ++e)
            num[e] += w[s] * o[e];
        }
#pragma unroll
        for (int e = 0; e < 8; ++e)
          x[8 * t + e] = __bfloat162float(__float2bfloat16(num[e] / den));
      } else {
        load_row(b.row, x);
      }
      consume_row(x, b.check, b.sink, j, layer, layers, done, gemv_cycles);
    } // CTAs past both roles (9 splits) idle
  }
}

int main(int argc, char **argv) {
  int layers = 64;
  unsigned work_ns = 1800, gemv_ns = 1000;
  if (argc > 1)
    layers = std::atoi(argv[1]);
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  int khz = 0;
  CHECK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0));
  const unsigned work_cycles = unsigned(work_ns * (khz / 1e6)),
                 gemv_cycles = unsigned(gemv_ns * (khz / 1e6));
  int per_sm = 0;
  CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, chain<true>,
                                                      THREADS, 0));
  const int ctas = KV_HEADS * MAX_SPLITS + CONSUMERS;
  std::printf("%s: %d SMs, %d CTAs an SM of %d threads; %d CTAs\n", prop.name,
              prop.multiProcessorCount, per_sm, THREADS, ctas);
  if (per_sm * prop.multiProcessorCount < ctas) {
    std::printf("the CTAs do not all fit at once: the model needs them to\n");
    return 1;
  }
  Buffers b;
  CHECK(cudaMalloc(&b.opart, MAX_SPLITS * HEADS * DIM * sizeof(float)));
  CHECK(cudaMalloc(&b.ml, MAX_SPLITS * HEADS * sizeof(float2)));
  CHECK(cudaMalloc(&b.row, ROW * sizeof(__nv_bfloat16)));
  CHECK(cudaMalloc(&b.check, ROW * sizeof(__nv_bfloat16)));
  const size_t words = size_t(layers) * WORDS_PER_LAYER;
  CHECK(cudaMalloc(&b.counters, words * sizeof(unsigned)));
  CHECK(cudaMalloc(&b.failed, sizeof(unsigned)));
  CHECK(cudaMalloc(&b.sink, CONSUMERS * sizeof(float)));
  CHECK(cudaMemset(b.failed, 0, sizeof(unsigned)));
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  std::vector<uint16_t> rows[2];
  for (int splits : {MAX_SPLITS, 9}) {
    for (int variant = 0; variant < 2; ++variant) {
      auto kernel = variant ? chain<true> : chain<false>;
      std::vector<float> us;
      for (int rep = 0; rep < 35; ++rep) {
        CHECK(cudaMemsetAsync(b.counters, 0, words * sizeof(unsigned)));
        CHECK(cudaEventRecord(e0));
        kernel<<<ctas, THREADS>>>(b, splits, layers, work_cycles, gemv_cycles);
        CHECK(cudaEventRecord(e1));
        CHECK(cudaEventSynchronize(e1));
        CHECK(cudaGetLastError());
        float ms;
        CHECK(cudaEventElapsedTime(&ms, e0, e1));
        if (rep >= 5)
          us.push_back(ms * 1000.f / layers);
      }
      unsigned failed;
      CHECK(
          cudaMemcpy(&failed, b.failed, sizeof failed, cudaMemcpyDeviceToHost));
      if (failed) {
        std::printf("a wait gave up (variant %d, %d splits)\n", variant,
                    splits);
        return 1;
      }
      std::sort(us.begin(), us.end());
      rows[variant].resize(ROW);
      CHECK(cudaMemcpy(rows[variant].data(), b.check, ROW * 2,
                       cudaMemcpyDeviceToHost));
      std::printf("%-22s splits %2d: %6.2f us a layer (min %6.2f, max %6.2f)\n",
                  variant ? "o_proj merges (O)" : "last split merges (T)",
                  splits, us[us.size() / 2], us.front(), us.back());
    }
    int worst = 0;
    for (int i = 0; i < ROW; ++i)
      worst = std::max(worst, std::abs(int(rows[0][i]) - int(rows[1][i])));
    std::printf("  merged rows differ by at most %d bf16 step(s)\n", worst);
    if (worst > 1)
      return 1;
  }
  std::printf("work %u ns a split, gemv %u ns a consumer (at %d MHz), %d "
              "layers\n",
              work_ns, gemv_ns, khz / 1000, layers);
  return 0;
}
