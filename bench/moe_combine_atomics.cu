// The MoE layer's combine, alone, three ways (bench/RESULTS.md, MoE section,
// twentieth session): is an L2 reduction (`red.global.add`) from the down
// tiles' epilogue cheaper than writing the permuted rows Yp and gathering
// them back in a combine pass?
//
//   store     : the down epilogue as it is: each permuted row of Yp written
//               (bf16, 16-byte stores); rows grouped by expert.
//   combine   : the combine tile as it is: Out[t] = bf16(sum_k w[t,k]
//   Yp[inv[t*K+k]]). red_bf16  : each permuted row added into Out[token] with
//               red.global.add.noftz.v4.bf16x2 (Out zeroed first).
//   red_f32   : each permuted row added into an fp32 Out32[token] with
//               red.global.add.v4.f32, then a cast pass to bf16.
//   red_f16   : (twenty-third session) as red_bf16 into an f16 Out16 with
//               red.global.add.noftz.v4.f16x2.
//
// Build and run (H200): nvcc -O3 -arch=sm_90a bench/moe_combine_atomics.cu -o
// /tmp/mca && /tmp/mca Times: CUDA events, median of 30 launches after 5
// warm-ups; T = 1024 and 4096, K = 8, H = 2048, 128 experts, uniform random
// routing.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "cuda_timing.h"

constexpr int H = 2048, K = 8, E = 128, CHUNKS = H / 8;

// One 16-byte chunk per thread-step, rows r in [0, R).
__global__ void store_rows(uint4 *Yp, int R) {
  for (long q = blockIdx.x * (long)blockDim.x + threadIdx.x;
       q < (long)R * CHUNKS; q += (long)gridDim.x * blockDim.x)
    Yp[q] = make_uint4(q, q + 1, q + 2, q + 3);
}

__global__ void combine(const float *tw, const int *inv, const uint4 *Yp,
                        uint4 *Out, int T) {
  for (long q = blockIdx.x * (long)blockDim.x + threadIdx.x;
       q < (long)T * CHUNKS; q += (long)gridDim.x * blockDim.x) {
    int t = q / CHUNKS, c = q % CHUNKS;
    uint4 y[K];
#pragma unroll
    for (int k = 0; k < K; ++k)
      y[k] = Yp[(long)inv[t * K + k] * CHUNKS + c];
    float acc[8] = {0};
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const __nv_bfloat16 *v = reinterpret_cast<const __nv_bfloat16 *>(&y[k]);
      float w = tw[t * K + k];
#pragma unroll
      for (int j = 0; j < 8; ++j)
        acc[j] += w * __bfloat162float(v[j]);
    }
    uint4 o;
    __nv_bfloat16 *ov = reinterpret_cast<__nv_bfloat16 *>(&o);
#pragma unroll
    for (int j = 0; j < 8; ++j)
      ov[j] = __float2bfloat16(acc[j]);
    Out[q] = o;
  }
}

// perm[r] = t*K + k of permuted row r.
__global__ void red_bf16(const int *perm, uint4 *Out, int R) {
  for (long q = blockIdx.x * (long)blockDim.x + threadIdx.x;
       q < (long)R * CHUNKS; q += (long)gridDim.x * blockDim.x) {
    int r = q / CHUNKS, c = q % CHUNKS;
    int t = perm[r] / K;
    uint4 v = make_uint4(0x3f803f80u, 0x3f803f80u, 0x3f803f80u,
                         0x3f803f80u); // 1.0 bf16
    uint4 *at = Out + (long)t * CHUNKS + c;
    asm volatile(
        "red.global.add.noftz.v4.bf16x2 [%0], {%1, %2, %3, %4};" ::"l"(at),
        "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
        : "memory");
  }
}

__global__ void red_f16(const int *perm, uint4 *Out16, int R) {
  for (long q = blockIdx.x * (long)blockDim.x + threadIdx.x;
       q < (long)R * CHUNKS; q += (long)gridDim.x * blockDim.x) {
    int r = q / CHUNKS, c = q % CHUNKS;
    int t = perm[r] / K;
    uint4 *at = Out16 + (long)t * CHUNKS + c;
    unsigned one = 0x3c003c00u; // 1.0 f16
    asm volatile(
        "red.global.add.noftz.v4.f16x2 [%0], {%1, %2, %3, %4};" ::"l"(at),
        "r"(one), "r"(one), "r"(one), "r"(one)
        : "memory");
  }
}

__global__ void red_f32(const int *perm, float4 *Out32, int R) {
  // Two 16-byte reductions per 8-column chunk.
  for (long q = blockIdx.x * (long)blockDim.x + threadIdx.x;
       q < (long)R * CHUNKS * 2; q += (long)gridDim.x * blockDim.x) {
    int r = q / (2 * CHUNKS), c = q % (2 * CHUNKS);
    int t = perm[r] / K;
    float4 *at = Out32 + (long)t * 2 * CHUNKS + c;
    asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(at),
                 "f"(1.f), "f"(1.f), "f"(1.f), "f"(1.f)
                 : "memory");
  }
}

__global__ void cast_f32(const float4 *Out32, uint4 *Out, int T) {
  for (long q = blockIdx.x * (long)blockDim.x + threadIdx.x;
       q < (long)T * CHUNKS; q += (long)gridDim.x * blockDim.x) {
    float4 a = Out32[2 * q], b = Out32[2 * q + 1];
    __nv_bfloat162 p0 = __floats2bfloat162_rn(a.x, a.y),
                   p1 = __floats2bfloat162_rn(a.z, a.w),
                   p2 = __floats2bfloat162_rn(b.x, b.y),
                   p3 = __floats2bfloat162_rn(b.z, b.w);
    uint4 o;
    o.x = *reinterpret_cast<unsigned *>(&p0);
    o.y = *reinterpret_cast<unsigned *>(&p1);
    o.z = *reinterpret_cast<unsigned *>(&p2);
    o.w = *reinterpret_cast<unsigned *>(&p3);
    Out[q] = o;
  }
}

int main() {
  int sms;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int grid = sms * 8, block = 256;
  std::printf("T, store_us, combine_us, red_bf16_us, red_f32_us, cast_us, "
              "memset_bf16_us, memset_f32_us, red_f16_us\n");
  for (int T : {1024, 4096}) {
    const int R = T * K;
    // Uniform routing: K distinct experts per token; rows grouped by expert.
    std::mt19937 rng(T);
    std::vector<std::vector<int>> by_expert(E);
    for (int t = 0; t < T; ++t) {
      std::vector<int> ex(E);
      for (int e = 0; e < E; ++e)
        ex[e] = e;
      std::shuffle(ex.begin(), ex.end(), rng);
      for (int k = 0; k < K; ++k)
        by_expert[ex[k]].push_back(t * K + k);
    }
    std::vector<int> perm, inv(R);
    for (auto &rows : by_expert)
      for (int s : rows) {
        inv[s] = perm.size();
        perm.push_back(s);
      }
    std::vector<float> tw(R, 0.125f);
    int *d_perm, *d_inv;
    float *d_tw;
    uint4 *d_Yp, *d_Out;
    float4 *d_Out32;
    CHECK(cudaMalloc(&d_perm, R * 4));
    CHECK(cudaMalloc(&d_inv, R * 4));
    CHECK(cudaMalloc(&d_tw, R * 4));
    CHECK(cudaMalloc(&d_Yp, (size_t)R * H * 2));
    CHECK(cudaMalloc(&d_Out, (size_t)T * H * 2));
    CHECK(cudaMalloc(&d_Out32, (size_t)T * H * 4));
    CHECK(cudaMemcpy(d_perm, perm.data(), R * 4, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(d_inv, inv.data(), R * 4, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(d_tw, tw.data(), R * 4, cudaMemcpyHostToDevice));
    // A 256 MB buffer written between launches pushes the others out of the L2.
    void *flush;
    CHECK(cudaMalloc(&flush, 256 << 20));
    auto cold = [&](auto f) {
      return [&, f] {
        CHECK(cudaMemsetAsync(flush, 0, 256 << 20));
        f();
      };
    };
    float flush_us =
        median_us([&] { CHECK(cudaMemsetAsync(flush, 0, 256 << 20)); });
    float st = median_us(cold([&] { store_rows<<<grid, block>>>(d_Yp, R); })) -
               flush_us;
    float cb = median_us(cold([&] {
                 combine<<<grid, block>>>(d_tw, d_inv, d_Yp, d_Out, T);
               })) -
               flush_us;
    float rb =
        median_us(cold([&] { red_bf16<<<grid, block>>>(d_perm, d_Out, R); })) -
        flush_us;
    float rf =
        median_us(cold([&] { red_f32<<<grid, block>>>(d_perm, d_Out32, R); })) -
        flush_us;
    float rh =
        median_us(cold([&] { red_f16<<<grid, block>>>(d_perm, d_Out, R); })) -
        flush_us;
    float cs =
        median_us(cold([&] { cast_f32<<<grid, block>>>(d_Out32, d_Out, T); })) -
        flush_us;
    float zb = median_us(cold([&] {
                 CHECK(cudaMemsetAsync(d_Out, 0, (size_t)T * H * 2));
               })) -
               flush_us;
    float zf = median_us(cold([&] {
                 CHECK(cudaMemsetAsync(d_Out32, 0, (size_t)T * H * 4));
               })) -
               flush_us;
    CHECK(cudaGetLastError());
    // Check the reductions once: every Out element is K (each token has K
    // rows).
    CHECK(cudaMemset(d_Out, 0, (size_t)T * H * 2));
    red_bf16<<<grid, block>>>(d_perm, d_Out, R);
    std::vector<__nv_bfloat16> out((size_t)T * H);
    CHECK(
        cudaMemcpy(out.data(), d_Out, out.size() * 2, cudaMemcpyDeviceToHost));
    CHECK(cudaMemset(d_Out32, 0, (size_t)T * H * 4));
    red_f32<<<grid, block>>>(d_perm, d_Out32, R);
    std::vector<float> out32((size_t)T * H * 1);
    CHECK(cudaMemcpy(out32.data(), d_Out32, out32.size() * 4,
                     cudaMemcpyDeviceToHost));
    long bad = 0;
    for (size_t i = 0; i < out.size(); ++i)
      bad += __bfloat162float(out[i]) != K || out32[i] != K;
    CHECK(cudaMemset(d_Out, 0, (size_t)T * H * 2));
    red_f16<<<grid, block>>>(d_perm, d_Out, R);
    std::vector<__half> out16((size_t)T * H);
    CHECK(cudaMemcpy(out16.data(), d_Out, out16.size() * 2,
                     cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < out16.size(); ++i)
      bad += __half2float(out16[i]) != K;
    std::printf("%d, %.1f, %.1f, %.1f, %.1f, %.1f, %.1f, %.1f, %.1f  (flush "
                "%.1f us, wrong elements %ld)\n",
                T, st, cb, rb, rf, cs, zb, zf, rh, flush_us, bad);
    CHECK(cudaFree(flush));
    for (void *p : {(void *)d_perm, (void *)d_inv, (void *)d_tw, (void *)d_Yp,
                    (void *)d_Out, (void *)d_Out32})
      CHECK(cudaFree(p));
  }
  return 0;
}
