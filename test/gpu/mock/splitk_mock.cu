// A hand-written stand-in for the compiler's split-K row-sum megakernel, following the
// runtime ABI of etc-artifact/1 exactly (every parameter 64-bit, memrefs expanded to
// allocated/aligned/offset/sizes/strides). It lets the runtime be tested on a GPU before
// (and independently of) the compiler. Graph: A (n,256) f32, B (n,4) f32, C (n,) f32;
// task 0 partial_sum grid (n,4): B[i,j] = sum(A[i, 64j:64j+64]), notify E[i];
// task 1 final_sum grid (n,): wait E[i] >= WAIT_COUNT, C[i] = sum(B[i,:]).
// Build with -DWAIT_COUNT=5 for the deliberately broken artifact.
#ifndef WAIT_COUNT
#define WAIT_COUNT 4
#endif
typedef long long i64;

#define MEMREF1(T, n) T *n##_alloc, T *n, i64 n##_off, i64 n##_size0, i64 n##_stride0
#define MEMREF2(T, n)                                                            \
  T *n##_alloc, T *n, i64 n##_off, i64 n##_size0, i64 n##_size1, i64 n##_stride0, \
      i64 n##_stride1

__device__ float block_sum(float v) {
  __shared__ float warp_sums[32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  __syncthreads();  // warp_sums may still be read from the previous call
  if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x >> 5] = v;
  __syncthreads();
  float total = 0.f;
  if (threadIdx.x == 0)
    for (int w = 0; w < (int)(blockDim.x >> 5); ++w) total += warp_sums[w];
  return total;  // valid in thread 0
}

extern "C" __global__ void __launch_bounds__(256)
    splitk(i64 n, MEMREF2(const float, A), MEMREF2(float, B), MEMREF1(float, C),
           MEMREF1(unsigned, cnt), MEMREF1(const i64, q), MEMREF1(int, st), i64 max_polls) {
  const int tid = threadIdx.x;
  // Check the descriptor words the runtime packed; report a mismatch as state 3 + a code.
  if (blockIdx.x == 0 && tid == 0) {
    int code = 0;
    if (A_alloc != A || A_off || A_size0 != n || A_size1 != 256 || A_stride0 != 256 || A_stride1 != 1) code = 1;
    else if (B_alloc != B || B_off || B_size0 != n || B_size1 != 4 || B_stride0 != 4 || B_stride1 != 1) code = 2;
    else if (C_alloc != C || C_off || C_size0 != n || C_stride0 != 1) code = 3;
    else if (cnt_alloc != cnt || cnt_off || cnt_size0 != n || cnt_stride0 != 1) code = 4;
    else if (q_alloc != q || q_off || q_size0 != gridDim.x + 1 + 5 * n || q_stride0 != 1 || q[0] != gridDim.x + 1) code = 5;
    else if (st_alloc != st || st_off || st_size0 < 8 || st_stride0 != 1) code = 6;
    else if (cnt != (unsigned *)(st + st_size0)) code = 7;  // runtime detail: one buffer
    if (code && atomicCAS(&st[0], 0, 3) == 0) st[1] = code;
  }
  __shared__ int failed;
  for (i64 k = q[blockIdx.x], end = q[blockIdx.x + 1]; k < end; ++k) {
    const i64 entry = q[k];
    const int task = (int)(entry >> 48);
    const i64 lin = entry & ((1ll << 48) - 1);
    if (task == 0) {
      const i64 i = lin / 4, j = lin % 4;
      float v = tid < 64 ? A[i * A_stride0 + (j * 64 + tid) * A_stride1] : 0.f;
      v = block_sum(v);
      if (tid == 0) B[i * B_stride0 + j * B_stride1] = v;
      __syncthreads();
      if (tid == 0) asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(&cnt[i]) : "memory");
    } else if (task == 1) {
      const i64 i = lin;
      if (tid == 0) {
        unsigned value = 0, sleep = 32;
        int ok = 0;
        for (i64 polls = 0;; ++polls) {
          asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(value) : "l"(&cnt[i]) : "memory");
          if ((int)value >= WAIT_COUNT) { ok = 1; break; }
          if (*(volatile int *)st != 0) break;  // another CTA gave up
          if (polls >= max_polls) {
            if (atomicCAS(&st[0], 0, 1) == 0) {
              st[1] = 0; st[2] = 1; st[3] = (int)value; st[4] = WAIT_COUNT;
              st[5] = (int)lin; st[6] = blockIdx.x; st[7] = (int)i;
            }
            break;
          }
          __nanosleep(sleep);
          sleep = sleep * 2 < 1024 ? sleep * 2 : 1024;
        }
        failed = !ok;
      }
      __syncthreads();
      if (failed) return;
      float v = tid < 4 ? __ldcg(&B[i * B_stride0 + tid * B_stride1]) : 0.f;
      v = block_sum(v);
      if (tid == 0) C[i * C_stride0] = v;
      __syncthreads();
    } else {
      if (tid == 0) { st[0] = 2; st[2] = task; }
      return;
    }
  }
}
