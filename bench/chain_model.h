// What the models of B = 1's attention chain share (bench/merge_proto.cu,
// bench/cluster_merge_proto.cu): the decoder's shapes, the scheduler's poll
// and notify, a busy wait standing for a stage's own time, and the partials
// a split leaves (any values whose merge is not trivial).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

constexpr int THREADS = 256;
constexpr int KV_HEADS = 8, GROUP = 4, HEADS = KV_HEADS * GROUP, DIM = 64;
constexpr int ROW = HEADS * DIM; // 2048
constexpr int CONSUMERS = 128;
constexpr int MAX_SPLITS = 17;
constexpr long long MAX_POLLS = 1ll << 22; // then the launch gives up

// Polls with ld.acquire.gpu and the decoder's nanosleep backoff (16 to 256
// ns) until *addr >= target; 1 (and *failed set) if it gave up.
__device__ inline unsigned poll_acquire(const unsigned *addr, unsigned target,
                                        unsigned *failed) {
  unsigned sleep_ns = 16, v;
  for (long long polls = 0;; ++polls) {
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];"
                 : "=r"(v)
                 : "l"(addr)
                 : "memory");
    if (v >= target)
      return 0;
    if (polls > MAX_POLLS || *(volatile unsigned *)failed) {
      atomicExch(failed, 1u);
      return 1;
    }
    __nanosleep(sleep_ns);
    sleep_ns = min(sleep_ns * 2, 256u);
  }
}

// A fence then a relaxed add, as the decoder's notify.
__device__ inline void notify(unsigned *addr) {
  __threadfence();
  atomicAdd(addr, 1u);
}

// Busy for `cycles` SM clocks (%globaltimer ticks too coarsely on some parts).
__device__ inline void spin(unsigned cycles) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
}

// The partial a split leaves for (head, dim) at layer `layer`.
__device__ inline float partial_out(int split, int head, int dim, int layer) {
  return __sinf(0.01f * (split * 131 + head * 17 + dim + layer));
}
__device__ inline float2 partial_ml(int split, int head, int layer) {
  return make_float2(0.1f * __cosf(0.3f * (split + head + layer)),
                     1.f + 0.05f * split);
}

// Consumer `j` (o_proj's stand-in) loads the merged bf16 row into `x`
// (thread t its 8 dims).
__device__ inline void load_row(const __nv_bfloat16 *row, float *x) {
  const int t = threadIdx.x;
  uint4 v = __ldcg(reinterpret_cast<const uint4 *>(row) + t);
  const __nv_bfloat16 *h = reinterpret_cast<const __nv_bfloat16 *>(&v);
#pragma unroll
  for (int e = 0; e < 8; ++e)
    x[8 * t + e] = __bfloat162float(h[e]);
}

// ... then, the row built in `x`: consumer 0 keeps it in `check` at the last
// layer, every consumer reads it (kept live through `sink`), spends
// `gemv_cycles` and counts itself on `done`.
__device__ inline void consume_row(const float *x, __nv_bfloat16 *check,
                                   float *sink, int j, int layer, int layers,
                                   unsigned *done, unsigned gemv_cycles) {
  const int t = threadIdx.x;
  __syncthreads();
  if (j == 0 && layer == layers - 1)
    for (int e = 0; e < 8; ++e)
      check[8 * t + e] = __float2bfloat16(x[8 * t + e]);
  float acc = 0.f;
  for (int e = 0; e < ROW / THREADS; ++e)
    acc += x[(t + e * THREADS + j) % ROW];
  spin(gemv_cycles);
  if (acc == 12345.f)
    sink[j] = acc;
  __syncthreads();
  if (t == 0)
    notify(done);
}
