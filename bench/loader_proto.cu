// Would a loader warp that streams weights across instances bring the B = 1
// decode step to the issue's 650 µs? (docs/decoder.md, "Next"; written and
// run in the thirty-fourth session, bench/RESULTS.md item 146.)
//
// A model of the B = 1 step, not the decoder: 16 layers of six stages with
// the decoder's weight bytes (qkv 12.6 MB, o_proj 8.4, gate/up 67.1, down
// 33.6) and an LM head of 525 MB, 2.47 GB in all, each stage's instances
// dealt round-robin to 2 CTAs per SM, every instance of a stage waiting for
// all of the previous stage's (an acquire poll on a counter the previous
// stage's instances add to, release, as the kernel's events do). The
// attention and its combine read no weights: they read the cache (2 MB a
// layer) in dependent rounds and are held to the trace's durations (~5 and
// ~2 µs) by a spin, so the HBM idles during them as in the decoder.
// A GEMM instance's weights arrive in 16 KB chunks by cp.async.bulk into a
// ring of S slots of the CTA's shared memory; its threads multiply each
// chunk by the stage's input (read after the wait) as a 1-row GEMV does.
// Stage tables (step_stages): the decoder's whole-stage waits ("layers",
// "layers32" with o_proj in 256 instances), gate/up and down fused
// ("fused"), and point-to-point waits where the data allow ("p2p").
// Variants, same bytes and dependencies:
//   A0 : per-instance ring filled after the waits (the decoder before the
//        seventeenth session's prefetch);
//   A  : per-instance ring, its first S chunks issued before the waits (the
//        decoder's `prefetch_ring`, today's kernel);
//   B  : a ninth warp walks the CTA's queue ahead of the compute warps and
//        issues every GEMM instance's chunks into one ring as slots free
//        (full/empty mbarriers; the ring's phases run across instances);
//   B0 : B without any waits (no dependencies): the weights' stream alone;
//   l2_ahead > 0: A or B also asks the L2 for the chunk that many further on.
// Reported: the launch's median time (cuda_timing.h), µs per layer (minus
// the LM head's share, by the LM-head-only launch), and the step against
// the floor of 2.47 GB at the copy bandwidth measured in the same run.
//
// Build and run (H200): nvcc -O3 -arch=sm_90a bench/loader_proto.cu -o /tmp/lp
// && /tmp/lp
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "cuda_timing.h"

constexpr int LAYERS = 16;
constexpr int CHUNK = 16384; // bytes of one ring slot
constexpr int COMPUTE = 256; // compute threads

enum Kind { GEMM = 0, ATTN = 1 };
struct Stage {
  int kind, instances;
  int bytes;     // weight bytes per instance (GEMM) or cache bytes (ATTN)
  int spin_ns;   // ATTN: the instance's least duration
  // What an instance waits for: span == 0, every instance of the previous
  // stage; else instance i waits for the previous stage's instances
  // [(i / per) * span, (i / per + 1) * span) (point to point, <= 32).
  int per, span;
};
constexpr int MAX_INSTANCES = 1024; // per stage: the done flags' stride
// One layer: qkv, attention, combine, o_proj, gate/up, down.
constexpr int PER_LAYER = 6;
__constant__ Stage c_stages[PER_LAYER * LAYERS + 1];
__constant__ size_t c_weight_offset[PER_LAYER * LAYERS + 1];

__device__ __forceinline__ unsigned smem_addr(const void *p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
  asm volatile("{\n .reg .pred p;\n W: mbarrier.try_wait.parity.shared::cta."
               "b64 p, [%0], %1;\n @!p bra W;\n}" ::"r"(bar),
               "r"(parity)
               : "memory");
}
__device__ __forceinline__ void bulk_load(unsigned dst, const void *src,
                                          int bytes, unsigned bar) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(
                   bar),
               "r"(bytes)
               : "memory");
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::"
               "bytes [%0], [%1], %2, [%3];" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}
__device__ __forceinline__ void compute_sync() {
  asm volatile("bar.sync 1, %0;" ::"n"(COMPUTE) : "memory");
}
__device__ __forceinline__ unsigned long long now_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}

struct Args {
  const char *weights; // every stage's weights, one after the other
  const float *cache;  // per layer 2 MB
  float *act;          // stage outputs (2048 floats each, reused)
  float *sink;
  unsigned *counters;  // one per stage, growing by launch
  unsigned *done;      // per stage and instance: the last launch that ran it
  unsigned epoch;      // launches before this one
  int stages;          // stages in the step (fewer: the LM head alone)
  int first;           // first stage index
  int variant;         // 0 = A0, 1 = A, 2 = B, 3 = B0
  int l2_ahead;        // B: chunks from a ring load to its L2 prefetch
};

// This CTA's GEMM chunks in queue order (the loader's walk).
struct Chunks {
  const Args &a;
  int g, i, c = 0;
  bool done = false;
  __device__ explicit Chunks(const Args &args) : a(args), g(args.first) {
    i = blockIdx.x - gridDim.x;
    next_instance();
  }
  __device__ void next_instance() {
    i += gridDim.x;
    while (g < a.first + a.stages &&
           (c_stages[g].kind != GEMM || i >= c_stages[g].instances)) {
      ++g;
      i = blockIdx.x;
    }
    done = g >= a.first + a.stages;
    c = 0;
  }
  __device__ void advance() {
    if (++c == c_stages[g].bytes / CHUNK)
      next_instance();
  }
  __device__ const char *address() const {
    return a.weights + c_weight_offset[g] + size_t(i) * c_stages[g].bytes +
           size_t(c) * CHUNK;
  }
};

template <int S>
__global__ void __launch_bounds__(COMPUTE + 32, 2) step(Args a) {
  extern __shared__ __align__(128) char ring[];
  __shared__ __align__(8) unsigned long long full[S], empty[S];
  __shared__ float x[2048];
  const bool loader = a.variant >= 2;
  if (threadIdx.x == 0) {
    for (int s = 0; s < S; ++s) {
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(
          smem_addr(&full[s])));
      asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(
                       smem_addr(&empty[s])),
                   "r"(COMPUTE / 32));
    }
    asm volatile("fence.mbarrier_init.release.cluster;");
  }
  __syncthreads();
  const int warp = threadIdx.x / 32;
  if (warp == COMPUTE / 32) {
    // The loader: every GEMM chunk of this CTA's queue, in queue order, and
    // (l2_ahead > 0) an L2 prefetch of the chunk l2_ahead further on.
    if (!loader || threadIdx.x % 32)
      return;
    Chunks next(a), ahead(a);
    for (int p = 0; p < a.l2_ahead; ++p)
      ahead.advance();
    for (unsigned used = 0; !next.done; ++used, next.advance()) {
      int slot = used % S;
      if (a.l2_ahead && !ahead.done) {
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(
                         ahead.address()),
                     "r"(CHUNK)
                     : "memory");
        ahead.advance();
      }
      mbar_wait(smem_addr(&empty[slot]), ((used / S) & 1) ^ 1);
      bulk_load(smem_addr(ring + slot * CHUNK), next.address(), CHUNK,
                smem_addr(&full[slot]));
    }
    return;
  }
  float acc = 0.f;
  unsigned used = 0; // chunks consumed (slot and parity)
  // A with l2_ahead: thread 0 asks the L2 for the chunk l2_ahead past each
  // one it loads, across instances as the loader would.
  Chunks ahead(a);
  for (int p = 0; p < a.l2_ahead && a.variant == 1; ++p)
    ahead.advance();
  auto l2_next = [&] {
    if (a.variant == 1 && a.l2_ahead && !ahead.done) {
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(
                       ahead.address()),
                   "r"(CHUNK)
                   : "memory");
      ahead.advance();
    }
  };
  for (int g = a.first; g < a.first + a.stages; ++g) {
    Stage st = c_stages[g];
    const int chunks = st.kind == GEMM ? st.bytes / CHUNK : 0;
    for (int i = blockIdx.x; i < st.instances; i += gridDim.x) {
      const char *w = a.weights + c_weight_offset[g] + size_t(i) * st.bytes;
      // A: the instance's first S chunks before its waits.
      if (a.variant == 1 && threadIdx.x == 0)
        for (int c = 0; c < S && c < chunks; ++c) {
          bulk_load(smem_addr(ring + ((used + c) % S) * CHUNK),
                    w + size_t(c) * CHUNK, CHUNK,
                    smem_addr(&full[(used + c) % S]));
          l2_next();
        }
      // Wait for every instance of the previous stage, or (span) for some.
      if (threadIdx.x == 0 && g > a.first && a.variant != 3 && !st.span) {
        unsigned need = c_stages[g - 1].instances * (a.epoch + 1);
        unsigned seen;
        do {
          asm volatile("ld.acquire.gpu.u32 %0, [%1];"
                       : "=r"(seen)
                       : "l"(a.counters + g - 1)
                       : "memory");
        } while (seen < need);
      }
      if (warp == 0 && g > a.first && a.variant != 3 && st.span &&
          threadIdx.x < st.span) {
        const unsigned *flag = a.done + size_t(g - 1) * MAX_INSTANCES +
                               (i / st.per) * st.span + threadIdx.x;
        unsigned seen;
        do {
          asm volatile("ld.acquire.gpu.u32 %0, [%1];"
                       : "=r"(seen)
                       : "l"(flag)
                       : "memory");
        } while (seen < a.epoch + 1);
      }
      compute_sync();
      if (a.variant == 0 && threadIdx.x == 0)
        for (int c = 0; c < S && c < chunks; ++c)
          bulk_load(smem_addr(ring + ((used + c) % S) * CHUNK),
                    w + size_t(c) * CHUNK, CHUNK,
                    smem_addr(&full[(used + c) % S]));
      if (st.kind == GEMM) {
        const float *in = a.act + (g % 2) * 2048;
        for (int k = threadIdx.x; k < 2048; k += COMPUTE)
          x[k] = __ldcg(in + k);
        compute_sync();
        for (int c = 0; c < chunks; ++c, ++used) {
          int slot = used % S;
          mbar_wait(smem_addr(&full[slot]), (used / S) & 1);
          const uint4 *v = reinterpret_cast<const uint4 *>(ring + slot * CHUNK);
          for (int j = 0; j < CHUNK / 16 / COMPUTE; ++j) {
            uint4 q = v[threadIdx.x + j * COMPUTE];
            int k = (threadIdx.x * 8 + j * 2048) % 2048;
            acc += __uint_as_float(q.x << 16) * x[k] +
                   __uint_as_float(q.y << 16) * x[k + 2] +
                   __uint_as_float(q.z << 16) * x[k + 4] +
                   __uint_as_float(q.w << 16) * x[k + 6];
          }
          if (loader) {
            __syncwarp();
            if (threadIdx.x % 32 == 0)
              asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(
                               smem_addr(&empty[slot]))
                           : "memory");
          } else {
            compute_sync(); // the slot is free before thread 0 refills it
            if (threadIdx.x == 0 && c + S < chunks) {
              bulk_load(smem_addr(ring + slot * CHUNK),
                        w + size_t(c + S) * CHUNK, CHUNK,
                        smem_addr(&full[slot]));
              l2_next();
            }
          }
        }
      } else {
        // Attention / combine: dependent rounds over the cache, then hold.
        unsigned long long t0 = now_ns();
        const float *c0 = a.cache + (size_t(g / PER_LAYER) * 64 + i) * 8192;
        int per_round = st.bytes / 4 / 4; // floats per round
        for (int r = 0; r < 4; ++r) {
          for (int k = threadIdx.x; k < per_round; k += COMPUTE)
            acc += __ldcg(c0 + r * per_round + k);
          x[threadIdx.x] = acc;
          compute_sync();
          acc += x[(threadIdx.x + 1) % COMPUTE];
          compute_sync();
        }
        if (threadIdx.x == 0)
          while (now_ns() - t0 < (unsigned long long)st.spin_ns) {
          }
      }
      // Outputs, then the instance's event.
      float *out = a.act + ((g + 1) % 2) * 2048;
      if (threadIdx.x % 32 == 0)
        out[(i * 8 + warp) % 2048] = acc;
      compute_sync();
      if (threadIdx.x == 0) {
        asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(
                         a.counters + g)
                     : "memory");
        asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(
                         a.done + size_t(g) * MAX_INSTANCES + i),
                     "r"(a.epoch + 1)
                     : "memory");
      }
    }
  }
  if (acc == 1.2345e-30f)
    a.sink[0] = acc;
}

// The step's stages. "layers": the decoder's six a layer, every stage
// waiting for all of the previous one. "fused": gate/up and down as one stage
// of 384 KB instances (down split by gate/up's column blocks) and a 1 µs
// reduce. "p2p": the decoder's grids with point-to-point waits where the
// data allow them (an attention instance waits for its kv head's 24 qkv
// blocks, the combine of a head for its 8 splits, o_proj split by heads
// (256 instances of 32 KB) for its head's combine, a down part of k for the
// gate/up block that wrote its k); qkv and gate/up still wait for all (their
// RMSNorm needs whole rows). "layers32": "layers" with p2p's o_proj grid.
std::vector<Stage> step_stages(const char *kind) {
  std::string k = kind;
  std::vector<Stage> layer = {
      {GEMM, 96, 32 * 2048 * 2, 0},      // qkv: 3072 columns, 32 a block
      {ATTN, 64, 32768, 5000},           // attention: 2 MB of cache
      {ATTN, 4, 4096, 2000},             // combine
      {GEMM, 64, 32 * 2048 * 2, 0},      // o_proj: 2048 columns
      {GEMM, 256, 2 * 32 * 2048 * 2, 0}, // gate/up: 2 x 32 columns
      {GEMM, 256, 8 * 8192 * 2, 0},      // down: 8 columns of k = 8192
  };
  if (k == "fused") {
    layer[4] = {GEMM, 256, 3 * 32 * 2048 * 2, 0};
    layer[5] = {ATTN, 32, 4096, 1000};
  }
  if (k == "p2p" || k == "layers32") {
    bool p = k == "p2p";
    layer[0] = {GEMM, 192, 16 * 2048 * 2, 0};             // qkv, 16 columns
    layer[1] = {ATTN, 64, 32768, 5000, 8, p ? 24 : 0};    // 8 heads x 8
    layer[2] = {ATTN, 8, 4096, 2000, 1, p ? 8 : 0};       // a head each
    layer[3] = {GEMM, 256, 64 * 256 * 2, 0, 32, p ? 1 : 0}; // 8 x 32
    layer[5] = {GEMM, 256, 8 * 8192 * 2, 0, 1, p ? 1 : 0};
  }
  std::vector<Stage> stages;
  for (int l = 0; l < LAYERS; ++l)
    stages.insert(stages.end(), layer.begin(), layer.end());
  stages.push_back({GEMM, 1002, 128 * 2048 * 2, 0}); // LM head: 128256 cols
  return stages;
}

int main() {
  int sms;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int grid = 2 * sms;
  const size_t cache_bytes = size_t(LAYERS) * 64 * 32768;
  size_t total = 0;
  for (const Stage &s : step_stages("layers"))
    if (s.kind == GEMM)
      total += size_t(s.instances) * s.bytes;
  Args a{};
  char *w;
  float *cache, *act, *sink;
  unsigned *counters;
  CHECK(cudaMalloc(&w, total));
  CHECK(cudaMemset(w, 0x3c, total));
  CHECK(cudaMalloc(&cache, cache_bytes));
  CHECK(cudaMemset(cache, 0, cache_bytes));
  CHECK(cudaMalloc(&act, 2 * 2048 * 4));
  CHECK(cudaMemset(act, 0, 2 * 2048 * 4));
  CHECK(cudaMalloc(&sink, 4));
  CHECK(cudaMalloc(&counters, (PER_LAYER * LAYERS + 1) * 4));
  unsigned *done;
  const size_t done_bytes = size_t(PER_LAYER * LAYERS + 1) * MAX_INSTANCES * 4;
  CHECK(cudaMalloc(&done, done_bytes));
  a.done = done;
  a.weights = w;
  a.cache = cache;
  a.act = act;
  a.sink = sink;
  a.counters = counters;
  double bw = copy_bandwidth_tbps();
  double floor_us = total / (bw * 1e12) * 1e6;
  std::printf("grid %d CTAs, weights %.3f GB, copy bandwidth %.2f TB/s, "
              "floor %.1f us\n",
              grid, total / 1e9, bw, floor_us);
  const char *names[] = {"A0 ring after waits", "A  ring before waits",
                         "B  loader warp", "B0 loader, no waits"};
  constexpr int S = 6;
  auto run = [&](int variant, int l2_ahead, int first, int nstages) {
    size_t smem = size_t(S) * CHUNK;
    CHECK(cudaFuncSetAttribute(step<S>,
                               cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(smem)));
    CHECK(cudaMemset(counters, 0, (PER_LAYER * LAYERS + 1) * 4));
    CHECK(cudaMemset(done, 0, done_bytes));
    a.epoch = 0;
    a.variant = variant;
    a.l2_ahead = l2_ahead;
    a.first = first;
    a.stages = nstages;
    float us = median_us([&] {
      step<S><<<grid, COMPUTE + 32, smem>>>(a);
      a.epoch++;
    });
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    return us;
  };
  struct Variant {
    const char *table;
    int variant, l2_ahead;
  };
  const Variant variants[] = {
      {"layers", 1, 0},   {"layers", 2, 0},   {"layers", 3, 0},
      {"layers32", 1, 0}, {"layers32", 2, 0}, {"p2p", 1, 0},
      {"p2p", 2, 0},      {"fused", 1, 0},    {"layers", 1, 6},
  };
  for (const Variant &v : variants) {
    std::vector<Stage> stages = step_stages(v.table);
    std::vector<size_t> offset;
    size_t at = 0;
    for (const Stage &s : stages) {
      offset.push_back(at);
      if (s.kind == GEMM)
        at += size_t(s.instances) * s.bytes;
    }
    CHECK(cudaMemcpyToSymbol(c_stages, stages.data(),
                             stages.size() * sizeof(Stage)));
    CHECK(cudaMemcpyToSymbol(c_weight_offset, offset.data(),
                             offset.size() * sizeof(size_t)));
    const int all = static_cast<int>(stages.size());
    float us = run(v.variant, v.l2_ahead, 0, all);
    float head = run(v.variant, v.l2_ahead, all - 1, 1);
    std::printf("%-8s %-22s L2 ahead %2d chunks: step %7.1f us (%.1f%% of "
                "floor)  LM head alone %6.1f  per layer %5.1f\n",
                v.table, names[v.variant], v.l2_ahead, us,
                100 * floor_us / us, head, (us - head) / LAYERS);
  }
  return 0;
}
