// What the standalone CUDA benchmarks in bench/ share: a CUDA-call check
// that exits with the failing call's place and message, the median time of
// a launch (CUDA events, 30 runs after 5 warm-ups) and the device's copy
// bandwidth.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CHECK(x)                                                               \
  do {                                                                         \
    cudaError_t e = (x);                                                       \
    if (e != cudaSuccess) {                                                    \
      std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__,                   \
                   cudaGetErrorString(e));                                     \
      std::exit(1);                                                            \
    }                                                                          \
  } while (0)

// Median µs of `launch()` on the default stream.
template <class F> float median_us(F launch) {
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  for (int i = 0; i < 5; ++i)
    launch();
  std::vector<float> ts;
  for (int i = 0; i < 30; ++i) {
    CHECK(cudaEventRecord(a));
    launch();
    CHECK(cudaEventRecord(b));
    CHECK(cudaEventSynchronize(b));
    float ms;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    ts.push_back(ms * 1000);
  }
  CHECK(cudaEventDestroy(a));
  CHECK(cudaEventDestroy(b));
  std::sort(ts.begin(), ts.end());
  return ts[ts.size() / 2];
}

// The device-to-device copy bandwidth in TB/s (read + write bytes of a
// 1 GiB cudaMemcpy, median_us), the baseline every stream is compared to.
inline double copy_bandwidth_tbps() {
  size_t big = size_t(1) << 30;
  void *x, *y;
  CHECK(cudaMalloc(&x, big));
  CHECK(cudaMalloc(&y, big));
  float us = median_us(
      [&] { CHECK(cudaMemcpy(y, x, big, cudaMemcpyDeviceToDevice)); });
  CHECK(cudaFree(x));
  CHECK(cudaFree(y));
  return 2.0 * big / (us * 1e-6) / 1e12;
}
