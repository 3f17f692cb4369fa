// Would 2-CTA clusters sharing the activation boxes by TMA multicast speed up
// the large decoder kernel's projections at B = 64? (Written and run in the
// thirty-seventh session, bench/RESULTS.md item 166.)
//
// Item 154 has the B = 64 projections as a stream whose k-tiles each take
// ~0.78 µs whatever their bytes' source: per k-tile a weight box from HBM and
// an activation box (64 rows x 64 k) from L2, as many activation bytes as
// weight bytes (gate/up: half as many), two CTAs a SM, 4 stages in flight.
// If the bytes moved into the SMs bound the stages, a pair of CTAs whose
// instances share their k range (two column blocks of one part) could load
// half of the activation box each and multicast it to both: a third to a
// half fewer bytes from L2 into the SMs.
//
// A model of the stages, not the decoder: 16 layers of the large kernel's
// four projections with its grids (qkv 48 column blocks x 4 parts, o_proj
// 32 x 4, gate/up 128 x 2 with 128 weight rows a block, down 32 x 8), each
// instance of a stage waiting for all of the previous one (an acquire poll
// on a counter, release adds), dealt round-robin to 2 CTAs per SM (instance
// i = part * blocks + block, so CTAs 2p and 2p + 1 hold the two column
// blocks of one part). Per k-tile a weight box (64 x 64 or 128 x 64 bf16,
// one contiguous chunk as the chunked weights are) and the activation box,
// by cp.async.bulk into a 4-stage ring (thread 0 loads, every thread reads
// the stage as the wgmma would, the ring's slots given back by a barrier);
// the instance's first weight boxes go out before its wait, the activation
// boxes after it (as the decoder's `prefetch_ring`). No meeting, no epilogue.
// Each variant refills a slot as the decoder's tiles do (thread 0 waits for
// it once the CTA has read it) or when it is free (thread 0 tests the slot
// and goes on; it waits only for a k-tile the CTA needs now: the MoE tiles'
// refill="test"). Variants, same bytes of weights:
//   U: each CTA loads its own activation boxes (today's tiles);
//   M: clusters of 2; each CTA loads half of every activation box with
//      .multicast::cluster into both CTAs' stage, whose full barrier counts
//      both halves; a slot is refilled once both CTAs gave it back (a remote
//      mbarrier arrive);
//   N: no activation boxes at all (the weights' stream alone: the bound);
//   C: U launched in clusters of 2 (where clusters place the CTAs);
//   K: U in clusters of 2, a slot refilled once both CTAs gave it back (M's
//      coupling without the multicast).
// Then U, M and N again with a producer warp (projections_pw): a ninth warp
// only loads, the consumers never wait but for full stages (CUTLASS's
// warp-specialized layout), so a coupled ring holds no consumer back (the
// coupled rings still lost 88 %: item 166).
// Reported: the launch's median (cuda_timing.h), µs per layer, and the
// weights' rate against the copy bandwidth measured in the same run.
//
// Build and run (H200): nvcc -O3 -gencode arch=compute_90a,code=sm_90a
// bench/multicast_proto.cu -o /tmp/mp && /tmp/mp
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <vector>

#include "cluster_ptx.h"
#include "cuda_timing.h"

constexpr int LAYERS = 16;
constexpr int THREADS = 256;
constexpr int STAGES = 4;
constexpr int A_BYTES = 64 * 64 * 2;          // activation box: 64 rows x 64 k
constexpr int SLOT = A_BYTES + 128 * 64 * 2;  // + the widest weight box

struct Stage {
  int blocks, parts, k_tiles, b_bytes; // b_bytes: weight box bytes
  int k;                               // the stage's k (activation row length)
};
// qkv, o_proj, gate/up, down of the large kernel (LARGE_BATCH, k_splits).
constexpr int PER_LAYER = 4;
__constant__ Stage c_stages[PER_LAYER];

enum Variant { UNICAST = 0, MULTICAST = 1, NO_A = 2, CLUSTERED = 3, COUPLED = 4 };

struct Args {
  const char *weights; // per layer and stage, instance-major, k-tile chunks
  const char *act;     // per stage an activation buffer: 64 x k bf16, chunked
  float *sink;
  unsigned *counters; // per (layer, stage), growing by launch
  unsigned epoch;
  int variant;
  int test_refill; // refill a slot once free, never waiting for it
};

__device__ __forceinline__ bool is_free(unsigned bar, unsigned parity) {
  unsigned done;
  asm volatile("{\n .reg .pred p;\n mbarrier.test_wait.parity.acquire.cluster."
               "shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
               : "=r"(done)
               : "r"(bar), "r"(parity)
               : "memory");
  return done;
}
// `bytes` at `dst` (and its barrier `bar`) in both CTAs of the cluster.
__device__ __forceinline__ void load_both(unsigned dst, const void *src,
                                          int bytes, unsigned bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::"
               "bytes.multicast::cluster [%0], [%1], %2, [%3], %4;" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar), "h"((unsigned short)3)
               : "memory");
}
__device__ __forceinline__ void arrive_both(unsigned bar) {
  asm volatile("mbarrier.arrive.release.cluster.shared::cta.b64 _, [%0];" ::"r"(
                   bar)
               : "memory");
  arrive_remote(peer_addr(bar, cluster_rank() ^ 1));
}

// Both rings' barriers (`empty` counting both CTAs' reads when coupled),
// visible to the cluster before anything lands in them; the CTA's rank.
template <bool CLUSTER>
__device__ unsigned init_ring(unsigned long long *full,
                              unsigned long long *empty, bool coupled) {
  unsigned rank = 0;
  if (CLUSTER)
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; ++s) {
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(
          smem_addr(&full[s])));
      asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(
                       smem_addr(&empty[s])),
                   "r"(coupled ? 2 : 1));
    }
    asm volatile("fence.mbarrier_init.release.cluster;");
  }
  if (CLUSTER)
    cluster_sync();
  else
    __syncthreads();
  return rank;
}
__device__ size_t layer_weight_bytes() {
  size_t bytes = 0;
  for (int g = 0; g < PER_LAYER; ++g)
    bytes += size_t(c_stages[g].blocks) * c_stages[g].parts *
             c_stages[g].k_tiles * c_stages[g].b_bytes;
  return bytes;
}
// A consumer thread's share of a stage's boxes (the wgmma's reads).
__device__ float read_stage(const char *stage, int a_part, int b_bytes) {
  const uint4 *v = reinterpret_cast<const uint4 *>(stage);
  float acc = 0.f;
  for (int j = threadIdx.x; j < (a_part + b_bytes) / 16; j += THREADS) {
    uint4 q = v[j + (a_part ? 0 : A_BYTES / 16)];
    acc += __uint_as_float(q.x) + __uint_as_float(q.w);
  }
  return acc;
}
// The slot read: to this CTA's barrier, and the peer's when coupled.
__device__ void give_back(unsigned bar, bool coupled) {
  if (coupled)
    arrive_both(bar);
  else
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar)
                 : "memory");
}

// Thread 0: until every instance of the stage before (l, g) has ended.
__device__ void wait_for_previous(const Args &a, int l, int g) {
  unsigned prev = l * PER_LAYER + g;
  const Stage &ps = c_stages[(g + PER_LAYER - 1) % PER_LAYER];
  if (prev)
    wait_count(a.counters + prev - 1, (a.epoch + 1) * ps.blocks * ps.parts);
}
// Thread 0: an instance of stage (l, g) has ended.
__device__ void done(const Args &a, int l, int g) {
  count_one(a.counters + l * PER_LAYER + g);
}

// Instance i of stage g: its weight boxes (from w_at, the layer's first), and
// the activation chunks of its k part: 64 x 64 boxes, k-tile major.
__device__ const char *instance_weights(const Args &a, const Stage &st, size_t w_at, int i) {
  return a.weights + w_at + size_t(i) * st.k_tiles * st.b_bytes;
}
__device__ const char *instance_acts(const Args &a, const Stage &st, int g, int i) {
  return a.act + size_t(g) * 64 * 8192 * 2 + size_t(i / st.blocks) * st.k_tiles * A_BYTES;
}

template <bool CLUSTER>
__global__ void __launch_bounds__(THREADS, 2) projections(Args a) {
  extern __shared__ __align__(128) char ring[];
  __shared__ __align__(8) unsigned long long full[STAGES], empty[STAGES];
  const bool coupled = a.variant == MULTICAST || a.variant == COUPLED;
  const bool own_a = a.variant == UNICAST || a.variant == CLUSTERED || a.variant == COUPLED;
  const unsigned rank = init_ring<CLUSTER>(full, empty, coupled);
  float acc = 0.f;
  unsigned used = 0; // k-tiles through the ring so far (slot and parity)
  const size_t layer_weights = layer_weight_bytes();
  for (int l = 0; l < LAYERS; ++l) {
    size_t w_at = size_t(l) * layer_weights;
    for (int g = 0; g < PER_LAYER; ++g) {
      const Stage st = c_stages[g];
      const int count = st.blocks * st.parts;
      const int a_part = a.variant == NO_A ? 0 : A_BYTES;
      for (int i = blockIdx.x; i < count; i += gridDim.x) {
        const char *w = instance_weights(a, st, w_at, i);
        const char *x = instance_acts(a, st, g, i);
        const unsigned base = used; // the instance's first k-tile in the ring
        auto fill = [&](int c, bool weights, bool acts) {
          unsigned slot = (base + c) % STAGES;
          unsigned base = smem_addr(ring + slot * SLOT);
          unsigned bar = smem_addr(&full[slot]);
          if (weights) {
            wait_parity(smem_addr(&empty[slot]), (((base + c) / STAGES) & 1) ^ 1);
            expect(bar, st.b_bytes + a_part);
            load(base + A_BYTES, w + size_t(c) * st.b_bytes, st.b_bytes, bar);
          }
          if (acts && own_a)
            load(base, x + size_t(c) * A_BYTES, A_BYTES, bar);
          if (acts && a.variant == MULTICAST)
            load_both(base + rank * (A_BYTES / 2),
                      x + size_t(c) * A_BYTES + rank * (A_BYTES / 2),
                      A_BYTES / 2, bar);
        };
        const int first = st.k_tiles < STAGES ? st.k_tiles : STAGES;
        if (threadIdx.x == 0)
          for (int c = 0; c < first; ++c)
            fill(c, true, false); // weights before the wait
        if (threadIdx.x == 0) {
          wait_for_previous(a, l, g);
          for (int c = 0; c < first; ++c)
            fill(c, false, true); // activations after it
        }
        __syncthreads();
        int issued = first; // thread 0: k-tiles of the instance loaded
        for (int c = 0; c < st.k_tiles; ++c, ++used) {
          unsigned slot = used % STAGES;
          while (a.test_refill && threadIdx.x == 0 && issued <= c)
            fill(issued++, true, true); // the k-tile is needed now: wait
          wait_parity(smem_addr(&full[slot]), (used / STAGES) & 1);
          acc += read_stage(ring + slot * SLOT, a_part, st.b_bytes);
          __syncthreads(); // the slot is read
          if (threadIdx.x == 0) {
            give_back(smem_addr(&empty[slot]), coupled);
            if (!a.test_refill && c + STAGES < st.k_tiles)
              fill(c + STAGES, true, true);
            // Refilled when free: each slot the ring has given back, no wait.
            while (a.test_refill && issued < st.k_tiles &&
                   issued <= c + STAGES &&
                   is_free(smem_addr(&empty[(base + issued) % STAGES]),
                           (((base + issued) / STAGES) & 1) ^ 1))
              fill(issued++, true, true);
          }
        }
        __syncthreads();
        if (threadIdx.x == 0)
          done(a, l, g);
      }
      w_at += size_t(count) * st.k_tiles * st.b_bytes;
    }
  }
  if (CLUSTER)
    cluster_sync(); // no multicast or arrive still bound for this CTA
  if (acc == 1.2345e-30f)
    a.sink[0] = acc;
}

// The same stages with a producer warp (warp 8) that only loads: it walks the
// CTA's instances, issues each k-tile's boxes once the slot is free (the
// first weight boxes before the instance's wait, which it polls, the
// activation boxes after), while the 8 consumer warps only wait for full
// stages, read them and give them back (to both CTAs' barriers when coupled)
// without waiting for anything else: CUTLASS's warp-specialized layout.
template <bool CLUSTER>
__global__ void __launch_bounds__(THREADS + 32, 2) projections_pw(Args a) {
  extern __shared__ __align__(128) char ring[];
  __shared__ __align__(8) unsigned long long full[STAGES], empty[STAGES];
  const bool coupled = a.variant == MULTICAST;
  const unsigned rank = init_ring<CLUSTER>(full, empty, coupled);
  const bool producer = threadIdx.x >= THREADS;
  const int a_part = a.variant == NO_A ? 0 : A_BYTES;
  float acc = 0.f;
  unsigned used = 0;
  const size_t layer_weights = layer_weight_bytes();
  for (int l = 0; l < LAYERS; ++l) {
    size_t w_at = size_t(l) * layer_weights;
    for (int g = 0; g < PER_LAYER; ++g) {
      const Stage st = c_stages[g];
      const int count = st.blocks * st.parts;
      for (int i = blockIdx.x; i < count; i += gridDim.x) {
        const char *w = instance_weights(a, st, w_at, i);
        const char *x = instance_acts(a, st, g, i);
        if (producer) {
          if (threadIdx.x == THREADS) {
            auto box_a = [&](int c) {
              unsigned slot = (used + c) % STAGES;
              unsigned base = smem_addr(ring + slot * SLOT);
              unsigned bar = smem_addr(&full[slot]);
              if (a.variant == UNICAST)
                load(base, x + size_t(c) * A_BYTES, A_BYTES, bar);
              if (a.variant == MULTICAST)
                load_both(base + rank * (A_BYTES / 2),
                          x + size_t(c) * A_BYTES + rank * (A_BYTES / 2),
                          A_BYTES / 2, bar);
            };
            auto box_w = [&](int c) {
              unsigned slot = (used + c) % STAGES;
              unsigned bar = smem_addr(&full[slot]);
              wait_parity(smem_addr(&empty[slot]), (((used + c) / STAGES) & 1) ^ 1);
              expect(bar, st.b_bytes + a_part);
              load(smem_addr(ring + slot * SLOT) + A_BYTES,
                   w + size_t(c) * st.b_bytes, st.b_bytes, bar);
            };
            const int first = st.k_tiles < STAGES ? st.k_tiles : STAGES;
            for (int c = 0; c < first; ++c)
              box_w(c);
            wait_for_previous(a, l, g);
            for (int c = 0; c < first; ++c)
              box_a(c);
            for (int c = first; c < st.k_tiles; ++c) {
              box_w(c);
              box_a(c);
            }
          }
          used += st.k_tiles;
          continue;
        }
        for (int c = 0; c < st.k_tiles; ++c, ++used) {
          unsigned slot = used % STAGES;
          wait_parity(smem_addr(&full[slot]), (used / STAGES) & 1);
          acc += read_stage(ring + slot * SLOT, a_part, st.b_bytes);
          asm volatile("bar.sync 1, %0;" ::"n"(THREADS) : "memory");
          if (threadIdx.x == 0)
            give_back(smem_addr(&empty[slot]), coupled);
        }
        if (threadIdx.x == 0)
          done(a, l, g);
      }
      w_at += size_t(count) * st.k_tiles * st.b_bytes;
    }
  }
  if (CLUSTER)
    cluster_sync();
  if (acc == 1.2345e-30f)
    a.sink[0] = acc;
}

int main() {
  int sms;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int grid = 2 * sms;
  // qkv 3072 columns, o_proj 2048, gate/up 16384 weight rows, down 2048 (k 8192).
  const Stage stages[PER_LAYER] = {
      {48, 4, 8, 64 * 64 * 2, 2048},
      {32, 4, 8, 64 * 64 * 2, 2048},
      {128, 2, 16, 128 * 64 * 2, 2048},
      {32, 8, 16, 64 * 64 * 2, 8192},
  };
  CHECK(cudaMemcpyToSymbol(c_stages, stages, sizeof(stages)));
  size_t layer = 0;
  for (const Stage &s : stages)
    layer += size_t(s.blocks) * s.parts * s.k_tiles * s.b_bytes;
  const size_t total = layer * LAYERS;
  char *w, *act;
  float *sink;
  unsigned *counters;
  CHECK(cudaMalloc(&w, total));
  CHECK(cudaMemset(w, 0x3c, total));
  CHECK(cudaMalloc(&act, PER_LAYER * 64 * 8192 * 2));
  CHECK(cudaMemset(act, 0x3c, PER_LAYER * 64 * 8192 * 2));
  CHECK(cudaMalloc(&sink, 4));
  CHECK(cudaMalloc(&counters, LAYERS * PER_LAYER * 4));
  const double bw = copy_bandwidth_tbps();
  std::printf("grid %d CTAs (2 a SM), weights %.1f MB a layer, copy bandwidth "
              "%.2f TB/s: %.1f us a layer at it\n",
              grid, layer / 1e6, bw, layer / (bw * 1e12) * 1e6);
  const size_t smem = size_t(STAGES) * SLOT;
  CHECK(cudaFuncSetAttribute(projections<false>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(smem)));
  CHECK(cudaFuncSetAttribute(projections<true>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(smem)));
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = 2;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3(THREADS);
  cfg.dynamicSmemBytes = smem;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  int clusters = 0;
  CHECK(cudaOccupancyMaxActiveClusters(&clusters, projections<true>, &cfg));
  std::printf("clusters of 2 resident at once: %d (the grid needs %d)\n",
              clusters, grid / 2);
  if (clusters < grid / 2) {
    std::printf("a persistent grid of clusters would not fit: stop\n");
    return 1;
  }
  const char *names[] = {"U own activation boxes", "M activations multicast",
                         "N no activation boxes", "C U in clusters",
                         "K U coupled in clusters"};
  auto print = [&](int pass, const char *name, const char *how, float us) {
    std::printf("pass %d  %-24s %-14s %8.1f us  %6.2f us a layer  weights at "
                "%.2f TB/s (%.0f%% of copy)\n",
                pass + 1, name, how, us, us / LAYERS,
                total / (us * 1e-6) / 1e12,
                100 * total / (us * 1e-6) / 1e12 / bw);
  };
  for (int pass = 0; pass < 2; ++pass)
    for (int t : {0, 1})
    for (int v : {UNICAST, MULTICAST, NO_A, CLUSTERED, COUPLED}) {
      if (t && (v == NO_A || v == CLUSTERED))
        continue;
      Args a{w, act, sink, counters, 0, v, t};
      CHECK(cudaMemset(counters, 0, LAYERS * PER_LAYER * 4));
      float us = median_us([&] {
        if (v == MULTICAST || v == CLUSTERED || v == COUPLED)
          CHECK(cudaLaunchKernelEx(&cfg, projections<true>, a));
        else
          projections<false><<<grid, THREADS, smem>>>(a);
        a.epoch++;
      });
      CHECK(cudaGetLastError());
      CHECK(cudaDeviceSynchronize());
      print(pass, names[v], t ? "refill if free" : "refill waits", us);
    }
  // The producer-warp kernel: own boxes, multicast (rings coupled), none.
  auto cfg_pw = cfg;
  cfg_pw.blockDim = dim3(THREADS + 32);
  for (auto f : {projections_pw<false>, projections_pw<true>})
    CHECK(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(smem)));
  CHECK(cudaOccupancyMaxActiveClusters(&clusters, projections_pw<true>, &cfg_pw));
  std::printf("producer warp: clusters of 2 resident at once: %d\n", clusters);
  for (int pass = 0; pass < 2 && clusters >= grid / 2; ++pass)
    for (int v : {UNICAST, MULTICAST, NO_A}) {
      Args a{w, act, sink, counters, 0, v, 0};
      CHECK(cudaMemset(counters, 0, LAYERS * PER_LAYER * 4));
      float us = median_us([&] {
        if (v == MULTICAST)
          CHECK(cudaLaunchKernelEx(&cfg_pw, projections_pw<true>, a));
        else
          projections_pw<false><<<grid, THREADS + 32, smem>>>(a);
        a.epoch++;
      });
      CHECK(cudaGetLastError());
      CHECK(cudaDeviceSynchronize());
      print(pass, names[v], "producer warp", us);
    }
  return 0;
}
