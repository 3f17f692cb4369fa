// Does the GEMV tiles' access pattern, not the bytes in flight, cap the
// weight stream at T = 1? (bench/RESULTS.md, MoE section, item 98: each
// CTA of the slot tiles streams ~17 GB/s whatever its ring depth or loop
// count, the layer ~3.1 TB/s.) Written in the twenty-fourth session, not
// run yet (that session's device time was spent).
//
// 50 MB of weights (8 experts x 1536 rows x 2048 bf16, the MoE layer's
// gate/up at T = 1), each CTA streaming tiles of R rows through a cp.async
// ring of S stages, one k chunk (128 bytes of each row) per stage, as the
// tiles do:
//   rows    : the nn.Linear layout the tiles read: a stage is R pieces of
//             128 bytes, 4 KB apart;
//   blocked : the same tile's bytes laid out stage by stage: a stage is
//             R * 128 contiguous bytes;
//   chunk8  : etc.tiles.gemm's weight_chunk=64 layout (8-row groups, each
//             group's k chunks of 64 elements row after row): a stage is
//             R / 8 pieces of 1 KB, 32 KB apart.
// A stage is consumed after a CTA barrier, as the tiles do (no arithmetic).
// R = 64 (192 tiles, the slot preset's), 48 (256) and 32 (384); S = 4, 6;
// grid = min(tiles, 2 x SMs), tiles dealt round robin. Reported: kernel
// time (median_us of cuda_timing.h: CUDA events, median of 30 after 5
// warm-ups) and TB/s, next to a device-to-device copy of 1 GiB (read +
// write bytes), timed the same way.
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

__device__ __forceinline__ void cp_async16(void *smem, const void *gmem) {
  unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem));
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
      for (int q = threadIdx.x; q < per_stage; q += blockDim.x) {
        int r = q / STAGE16, v = q % STAGE16;
        size_t off = layout == 1 ? static_cast<size_t>(c) * per_stage + q
                     : layout == 2
                         ? static_cast<size_t>(r / 8) * 8 * ROW16 +
                               c * 8 * STAGE16 + (r % 8) * STAGE16 + v
                         : static_cast<size_t>(r) * ROW16 + c * STAGE16 + v;
        cp_async16(slot + q, base + off);
      }
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

template <int S>
float run(const uint4 *w, int rows, int layout, unsigned *sink, int sms) {
  int tiles = ROWS / rows;
  int grid = std::min(tiles, 2 * sms);
  size_t smem = static_cast<size_t>(S) * rows * STAGE16 * sizeof(uint4);
  CHECK(cudaFuncSetAttribute(stream<S>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(smem)));
  float us = median_us(
      [&] { stream<S><<<grid, 256, smem>>>(w, rows, tiles, layout, sink); });
  CHECK(cudaGetLastError());
  return us;
}

int main() {
  int dev = 0, sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  size_t bytes = static_cast<size_t>(ROWS) * ROW16 * sizeof(uint4);
  uint4 *w;
  unsigned *sink;
  CHECK(cudaMalloc(&w, bytes));
  CHECK(cudaMalloc(&sink, 4));
  CHECK(cudaMemset(w, 1, bytes));
  // Copy bandwidth: 1 GiB device to device, read + write bytes.
  size_t big = size_t(1) << 30;
  void *x, *y;
  CHECK(cudaMalloc(&x, big));
  CHECK(cudaMalloc(&y, big));
  float copy_us = median_us(
      [&] { CHECK(cudaMemcpy(y, x, big, cudaMemcpyDeviceToDevice)); });
  std::printf("copy bandwidth %.3f TB/s (%d SMs)\n",
              2.0 * big / (copy_us * 1e-6) / 1e12, sms);
  const char *names[] = {"rows", "blocked", "chunk8"};
  for (int layout = 0; layout < 3; ++layout)
    for (int rows : {64, 48, 32})
      for (int s : {4, 6}) {
        float us = s == 4 ? run<4>(w, rows, layout, sink, sms)
                          : run<6>(w, rows, layout, sink, sms);
        std::printf("%-7s R=%2d S=%d tiles=%3d: %7.2f us, %.3f TB/s\n",
                    names[layout], rows, s, ROWS / rows, us,
                    bytes / (us * 1e-6) / 1e12);
      }
  return 0;
}
