// What the models of B = 1's attention chain share (bench/merge_proto.cu,
// bench/cluster_merge_proto.cu): the decoder's shapes, the scheduler's poll
// and notify, a busy wait standing for a stage's own time, and the partials
// a split leaves (any values whose merge is not trivial).
#pragma once

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
