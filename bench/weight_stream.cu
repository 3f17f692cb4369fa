// Does the GEMV tiles' access pattern, not the bytes in flight, cap the
// weight stream at T = 1? (bench/RESULTS.md, MoE section, items 98 and
// 100: each CTA of the slot tiles streams ~17 GB/s whatever its ring depth
// or loop count, the layer ~3.1 TB/s.) Written in the twenty-fourth and
// twenty-fifth sessions; run in the latter (results/weight-stream-session25-
// 2026-12-01.txt: the three layouts stream alike, so the pattern is not it).
// Its times are one launch per event pair, the host's launch gap included
// (~3-5 µs of its 18-20); bench/stream_ceiling.cu times streams back to back
// and inside the launch, and found the tiles' half-line copies cost 4-11 %
// (RESULTS items 102-103).
//
// 50 MB of weights (8 experts x 1536 rows x 2048 bf16, the MoE layer's
// gate/up at T = 1), each CTA streaming tiles of R rows through a ring of S
// stages, one k chunk (128 bytes of each row) per stage, as the tiles do.
// Three layouts of the same bytes:
//   rows    : the nn.Linear layout the tiles read: a stage is R pieces of
//             128 bytes, 4 KB apart;
//   blocked : the tile's bytes laid out stage by stage: a stage is R * 128
//             contiguous bytes;
//   chunk8  : etc.tiles.gemm's weight_chunk=64 layout (8-row groups, each
//             group's k chunks of 64 elements row after row): a stage is
//             R / 8 pieces of 1 KB, 32 KB apart.
// Two copy engines:
//   cp.async: every thread copies 16-byte vectors (the tiles' ring), two
//             CTAs per SM;
//   bulk    : warp 0 issues one cp.async.bulk per contiguous piece, the
//             stage's mbarrier counting the bytes (the TMA tiles' engine),
//             one or two CTAs per SM.
// A stage is consumed after a CTA barrier, as the tiles do (no arithmetic).
// R = 64 (192 tiles, the slot preset's), 48 (256) and 32 (384). Each launch
// reads the next of 8 copies of the weights (400 MB), so the 50 MB L2 does
// not serve one launch from the last. Reported: kernel time (median_us of
// cuda_timing.h: CUDA events, median of 30 after 5 warm-ups) and TB/s, next
// to a device-to-device copy of 1 GiB (read + write bytes), timed the same
// way.
//
// Build and run (H200): nvcc -O3 -arch=sm_90a bench/weight_stream.cu -o /tmp/ws
// && /tmp/ws
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cuda_timing.h"

constexpr int ROWS = 8 * 1536;       // weight rows
constexpr int ROW16 = 2048 * 2 / 16; // 16-byte vectors per row
constexpr int STAGE16 = 8;           // 16-byte vectors of a row per stage
constexpr int COPIES = 8;            // weight copies, one per launch in turn
constexpr size_t WEIGHT16 = static_cast<size_t>(ROWS) * ROW16;

enum Layout { ROWS_LAYOUT = 0, BLOCKED = 1, CHUNK8 = 2 };

// 16-byte vector q of stage c of a tile of `rows` rows (from the tile's
// first vector), in each layout.
__device__ __forceinline__ size_t vector_at(int layout, int rows, int c,
                                            int q) {
  int r = q / STAGE16, v = q % STAGE16;
  if (layout == BLOCKED)
    return static_cast<size_t>(c) * rows * STAGE16 + q;
  if (layout == CHUNK8)
    return static_cast<size_t>(r / 8) * 8 * ROW16 + c * 8 * STAGE16 +
           (r % 8) * STAGE16 + v;
  return static_cast<size_t>(r) * ROW16 + c * STAGE16 + v;
}

__device__ __forceinline__ unsigned smem_addr(const void *p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void cp_async16(void *smem, const void *gmem) {
  asm volatile(
      "cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_addr(smem)),
      "l"(gmem));
}
__device__ __forceinline__ void commit() {
  asm volatile("cp.async.commit_group;");
}
template <int N> __device__ __forceinline__ void wait_group() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N));
}

template <int S>
__global__ void __launch_bounds__(256, 2)
    stream(const uint4 *w, int rows, int tiles, int layout, unsigned *sink) {
  extern __shared__ uint4 ring[];
  const int per_stage = rows * STAGE16;
  const int chunks = ROW16 / STAGE16;
  unsigned acc = 0;
  for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const uint4 *base = w + static_cast<size_t>(tile) * rows * ROW16;
    auto issue = [&](int c) {
      uint4 *slot = ring + (c % S) * per_stage;
      for (int q = threadIdx.x; q < per_stage; q += blockDim.x)
        cp_async16(slot + q, base + vector_at(layout, rows, c, q));
      commit();
    };
    for (int c = 0; c < S - 1; ++c)
      issue(c);
    for (int c = 0; c < chunks; ++c) {
      if (c + S - 1 < chunks)
        issue(c + S - 1);
      else
        commit(); // an empty group keeps the count
      wait_group<S - 1>();
      __syncthreads();
      acc ^= ring[(c % S) * per_stage + threadIdx.x % per_stage].x;
      __syncthreads();
    }
  }
  if (acc == 0x9e3779b9u)
    sink[0] = acc; // never true in practice; keeps the reads
}

// The same stream through cp.async.bulk: warp 0 issues each contiguous
// piece of a stage (R of 128 B, R / 8 of 1 KB, or one of R * 128 B) on the
// stage's mbarrier, which counts the bytes; every thread waits on its
// phase. MIN_CTAS: the CTAs per SM asked of the compiler.
template <int S, int MIN_CTAS>
__global__ void __launch_bounds__(256, MIN_CTAS)
    stream_bulk(const uint4 *w, int rows, int tiles, int layout,
                unsigned *sink) {
  extern __shared__ __align__(128) uint4 ring[];
  __shared__ __align__(8) unsigned long long full[S];
  const int per_stage = rows * STAGE16;
  const int chunks = ROW16 / STAGE16;
  const int piece16 = layout == BLOCKED  ? per_stage
                      : layout == CHUNK8 ? 8 * STAGE16
                                         : STAGE16;
  const int pieces = per_stage / piece16;
  if (threadIdx.x == 0)
    for (int s = 0; s < S; ++s)
      asm volatile(
          "mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(&full[s])));
  asm volatile("fence.mbarrier_init.release.cluster;");
  __syncthreads();
  unsigned acc = 0;
  int used = 0; // stages consumed so far (sets each wait's parity)
  for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const uint4 *base = w + static_cast<size_t>(tile) * rows * ROW16;
    auto issue = [&](int c, int stage) {
      if (threadIdx.x >= 32)
        return;
      unsigned bar = smem_addr(&full[stage]);
      if (threadIdx.x == 0)
        asm volatile(
            "mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar),
            "r"(per_stage * 16));
      uint4 *slot = ring + stage * per_stage;
      for (int p = threadIdx.x; p < pieces; p += 32) {
        int q = p * piece16;
        asm volatile(
            "cp.async.bulk.shared::cluster.global.mbarrier::complete_"
            "tx::bytes [%0], [%1], %2, [%3];" ::"r"(smem_addr(slot + q)),
            "l"(base + vector_at(layout, rows, c, q)), "r"(piece16 * 16),
            "r"(bar)
            : "memory");
      }
    };
    for (int c = 0; c < S - 1 && c < chunks; ++c)
      issue(c, (used + c) % S);
    for (int c = 0; c < chunks; ++c) {
      if (c + S - 1 < chunks)
        issue(c + S - 1, (used + c + S - 1) % S);
      int stage = (used + c) % S;
      unsigned parity = ((used + c) / S) & 1;
      asm volatile(
          "{\n .reg .pred p;\n W: mbarrier.try_wait.parity.shared::cta."
          "b64 p, [%0], %1;\n @!p bra W;\n}" ::"r"(smem_addr(&full[stage])),
          "r"(parity)
          : "memory");
      acc ^= ring[stage * per_stage + threadIdx.x % per_stage].x;
      __syncthreads(); // the stage is free before warp 0 refills it
    }
    used += chunks;
  }
  if (acc == 0x9e3779b9u)
    sink[0] = acc;
}

struct Weights {
  const uint4 *w;
  int next = 0;
  const uint4 *advance() { return w + (next++ % COPIES) * WEIGHT16; }
};

template <class K>
float time_kernel(K kernel, Weights &wts, int rows, int layout, int grid,
                  size_t smem, unsigned *sink) {
  CHECK(cudaFuncSetAttribute(kernel,
                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(smem)));
  int tiles = ROWS / rows;
  float us = median_us([&] {
    kernel<<<grid, 256, smem>>>(wts.advance(), rows, tiles, layout, sink);
  });
  CHECK(cudaGetLastError());
  return us;
}

int main() {
  int dev = 0, sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  size_t bytes = WEIGHT16 * sizeof(uint4);
  uint4 *w;
  unsigned *sink;
  CHECK(cudaMalloc(&w, bytes * COPIES));
  CHECK(cudaMalloc(&sink, 4));
  CHECK(cudaMemset(w, 1, bytes * COPIES));
  Weights wts{w};
  std::printf("copy bandwidth %.3f TB/s (%d SMs)\n", copy_bandwidth_tbps(),
              sms);
  const char *names[] = {"rows", "blocked", "chunk8"};
  auto report = [&](const char *engine, int layout, int rows, int s, int grid,
                    float us) {
    std::printf(
        "%-8s %-7s R=%2d S=%d tiles=%3d CTAs=%3d: %7.2f us, %.3f TB/s\n",
        engine, names[layout], rows, s, ROWS / rows, grid, us,
        bytes / (us * 1e-6) / 1e12);
  };
  for (int layout = 0; layout < 3; ++layout)
    for (int rows : {64, 48, 32}) {
      int tiles = ROWS / rows;
      size_t stage = static_cast<size_t>(rows) * STAGE16 * sizeof(uint4);
      int two = std::min(tiles, 2 * sms), one = std::min(tiles, sms);
      report("cp.async", layout, rows, 4, two,
             time_kernel(stream<4>, wts, rows, layout, two, 4 * stage, sink));
      report("cp.async", layout, rows, 6, two,
             time_kernel(stream<6>, wts, rows, layout, two, 6 * stage, sink));
      report("bulk", layout, rows, 4, two,
             time_kernel(stream_bulk<4, 2>, wts, rows, layout, two, 4 * stage,
                         sink));
      report("bulk", layout, rows, 8, one,
             time_kernel(stream_bulk<8, 1>, wts, rows, layout, one, 8 * stage,
                         sink));
    }
  return 0;
}
