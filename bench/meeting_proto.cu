// Would the large decoder kernel's split-K parts meet faster in a cluster's
// distributed shared memory than through the L2? (Written in the fiftieth
// session, which had no device: bench/gpu_session50.sh step `meeting` runs
// it; bench/RESULTS.md item 252 is why.)
//
// At B = 32, L = 1024 each part of qkv or o_proj takes ~5.6 µs for 64 KB of
// weights, and a block's last part ~1.2-3.3 µs more for the meeting. Every
// part of a stage runs at once, each at 11-16 GB/s: the short stages are a
// latency chain per part, not the HBM. Today's meeting (the tiles' "fragments"
// meeting): each part stores its float32 accumulators to a workspace in L2,
// counts itself on the block's counter (acquire-release), and the part that
// arrives last loads the others' from L2, adds them and stores the block.
// In a cluster whose CTAs hold a block's parts, a part could instead keep its
// accumulators in its own shared memory and signal the block's leader by a
// remote mbarrier arrive; the leader reads them over distributed shared
// memory, so no part's accumulators go through the L2.
//
// A model of the four projection stages, built on bench/multicast_proto.cu's
// (item 166): 16 layers of the large kernel's grids (qkv 48 column blocks x
// 4 parts, o_proj 32 x 4, gate/up 128 x 2 with 128 weight rows, down 32 x 8),
// each stage's instances waiting for all of the previous stage (an acquire
// poll on a counter, release adds), one instance a CTA (2 a SM, 264 CTAs),
// a block's parts on consecutive CTAs. Per k-tile a weight box and a 64 x 64
// activation box by cp.async.bulk into a 4-stage ring, the first weight boxes
// before the wait (the decoder's prefetch_ring="shared"). Each thread keeps
// its share of the block's accumulators in registers (16 floats; 32 for
// gate/up's 128 columns). Then, by variant:
//   N: no meeting: each part ends after its k loop (the bound);
//   L: today's L2 meeting (workspace, counter, the last part loads the rest
//      with ld.global.cg, adds in part order, stores the bf16 block);
//   D2, D4, D8: clusters of 2, 4 or 8. A block's parts meet in groups of
//      min(parts, cluster): each non-leader part stores its accumulators to
//      its own shared memory (the idle ring) and arrives on the leader's
//      `met` barrier; the leader waits for them, reads their accumulators
//      with ld.shared::cluster, adds them in part order and stores the
//      block, then arrives on each part's `freed` barrier, which the part
//      waits for before it refills its ring. A block of more parts than the
//      cluster (down's 8 in D2 and D4) meets again through the L2 between
//      its groups' leaders.
// Reported: the launch's median (cuda_timing.h), µs per layer, and the
// weights' rate against the copy bandwidth measured in the same run. Then the
// latency of one meeting alone (`ping`): two CTAs, 1000 rounds in which CTA 1
// hands 16 KB of accumulators to CTA 0 (through the L2 with a release add
// and an acquire poll, or in a cluster of 2 through its own shared memory
// and a remote mbarrier arrive), CTA 0 reads and adds them and hands the
// buffer back the same way: µs a round, a part's hand-over and its return.
// The same two round trips bound B = 1's attention merge (item 238).
//
// Build and run (H200): nvcc -O3 -gencode arch=compute_90a,code=sm_90a
// bench/meeting_proto.cu -o /tmp/mt && /tmp/mt
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

#include "cluster_ptx.h"
#include "cuda_timing.h"

constexpr int LAYERS = 16;
constexpr int THREADS = 256;
constexpr int STAGES = 4;
constexpr int A_BYTES = 64 * 64 * 2;          // activation box: 64 rows x 64 k
constexpr int SLOT = A_BYTES + 128 * 64 * 2;  // + the widest weight box
constexpr int MAX_ACC = 32;                   // floats a thread: 64 x 128 / 256
constexpr int MAX_INSTANCES = 256;            // a stage's blocks x parts

struct Stage {
  int blocks, parts, k_tiles, b_bytes; // b_bytes: weight box bytes
};
constexpr int PER_LAYER = 4;
__constant__ Stage c_stages[PER_LAYER];

enum Variant { NONE = 0, L2 = 1, DSMEM = 2 };

struct Args {
  const char *weights; // per layer and stage, instance-major, k-tile chunks
  const char *act;     // per stage an activation buffer, k-tile chunks
  float *parts;        // the L2 meeting's workspace: instance x accumulators
  unsigned short *out; // the blocks' bf16 products
  unsigned *counters;  // per (layer, stage): instances ended, growing by launch
  unsigned *meets;     // per (layer, stage, block): parts counted, growing
  unsigned epoch;
  int variant;
};

__device__ __forceinline__ float4 load_remote(unsigned addr) {
  float4 v;
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(addr)
               : "memory");
  return v;
}
__device__ __forceinline__ float4 load_l2(const float *p) {
  float4 v;
  asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "l"(p)
               : "memory");
  return v;
}

__device__ size_t layer_weight_bytes() {
  size_t bytes = 0;
  for (int g = 0; g < PER_LAYER; ++g)
    bytes += size_t(c_stages[g].blocks) * c_stages[g].parts *
             c_stages[g].k_tiles * c_stages[g].b_bytes;
  return bytes;
}
// A consumer thread's share of a stage's boxes (the wgmma's reads).
__device__ float read_stage(const char *stage, int b_bytes) {
  const uint4 *v = reinterpret_cast<const uint4 *>(stage);
  float acc = 0.f;
  for (int j = threadIdx.x; j < (A_BYTES + b_bytes) / 16; j += THREADS) {
    uint4 q = v[j];
    acc += __uint_as_float(q.x) + __uint_as_float(q.w);
  }
  return acc;
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

// The CTA's accumulators: thread t holds n floats, float4 j of them at
// float4 index j * THREADS + t of the block's (n * THREADS floats) layout.
template <int N> struct Acc {
  float v[N];
};

// The block's bf16 product from the summed accumulators.
template <int N>
__device__ void store_block(const Args &a, const Acc<N> &acc, int n,
                            size_t block_at) {
#pragma unroll
  for (int j = 0; j < N / 4; ++j) {
    if (j * 4 >= n)
      break;
    unsigned short *o = a.out + block_at + size_t(j * THREADS + threadIdx.x) * 4;
    for (int q = 0; q < 4; ++q)
      o[q] = static_cast<unsigned short>(__float_as_uint(acc.v[j * 4 + q]) >> 16);
  }
}

// The L2 meeting among `count` parts of one block (a block's parts, or its
// groups' leaders), `me` being this one: store, count, and the last adds the
// others in order. Returns whether this part is the last (the block's sum
// then in `acc`).
template <int N>
__device__ bool meet_l2(const Args &a, Acc<N> &acc, int n, int count, int me,
                        float *slots, unsigned *counter, unsigned &last_flag) {
#pragma unroll
  for (int j = 0; j < N / 4; ++j)
    if (j * 4 < n)
      *reinterpret_cast<float4 *>(slots + ((size_t(me) * n / 4 + j) * THREADS + threadIdx.x) * 4) =
        make_float4(acc.v[4 * j], acc.v[4 * j + 1], acc.v[4 * j + 2], acc.v[4 * j + 3]);
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned old;
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;"
                 : "=r"(old)
                 : "l"(counter)
                 : "memory");
    last_flag = old + 1 == (a.epoch + 1) * count;
  }
  __syncthreads();
  if (!last_flag)
    return false;
  for (int q = 0; q < count; ++q) { // part order, this part's from registers
    if (q == me)
      continue;
#pragma unroll
    for (int j = 0; j < N / 4; ++j) {
      if (j * 4 >= n)
        break;
      float4 v = load_l2(slots + ((size_t(q) * n / 4 + j) * THREADS + threadIdx.x) * 4);
      acc.v[4 * j] += v.x, acc.v[4 * j + 1] += v.y;
      acc.v[4 * j + 2] += v.z, acc.v[4 * j + 3] += v.w;
    }
  }
  return true;
}

template <int C, int N>
__global__ void __launch_bounds__(THREADS, 2) projections(Args a) {
  extern __shared__ __align__(128) char ring[];
  __shared__ __align__(8) unsigned long long full[STAGES], empty[STAGES];
  __shared__ __align__(8) unsigned long long met, freed;
  __shared__ unsigned last_flag;
  const unsigned rank = C > 1 ? cluster_rank() : 0;
  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; ++s) {
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(
          smem_addr(&full[s])));
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(
          smem_addr(&empty[s])));
    }
    // A leader's `met` takes C - 1 arrivals: its group's other parts', the
    // rest its own (a group smaller than the cluster).
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(
                     smem_addr(&met)),
                 "r"(C > 1 ? C - 1 : 1));
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(
        smem_addr(&freed)));
    asm volatile("fence.mbarrier_init.release.cluster;");
  }
  if (C > 1)
    cluster_sync();
  else
    __syncthreads();
  Acc<N> acc;
  unsigned used = 0;    // k-tiles through the ring so far (slot and parity)
  unsigned led = 0;     // meetings led (the parity of `met`)
  unsigned exported = 0; // accumulators handed to a leader (`freed`'s parity)
  const size_t layer_weights = layer_weight_bytes();
  for (int l = 0; l < LAYERS; ++l) {
    size_t w_at = size_t(l) * layer_weights;
    for (int g = 0; g < PER_LAYER; ++g) {
      const Stage st = c_stages[g];
      const int count = st.blocks * st.parts;
      const int n = st.b_bytes / 128 * 64 / THREADS; // accumulators a thread
      for (int i = blockIdx.x; i < count; i += gridDim.x) {
        const int block = i / st.parts, part = i % st.parts;
        const char *w = a.weights + w_at + size_t(i) * st.k_tiles * st.b_bytes;
        const char *x = a.act + size_t(g) * 64 * 8192 * 2 +
                        size_t(part) * st.k_tiles * A_BYTES;
        const unsigned base = used;
        auto fill = [&](int c, bool weights, bool acts) {
          unsigned slot = (base + c) % STAGES;
          unsigned at = smem_addr(ring + slot * SLOT);
          unsigned bar = smem_addr(&full[slot]);
          if (weights) {
            wait_parity(smem_addr(&empty[slot]), (((base + c) / STAGES) & 1) ^ 1);
            expect(bar, st.b_bytes + A_BYTES);
            load(at + A_BYTES, w + size_t(c) * st.b_bytes, st.b_bytes, bar);
          }
          if (acts)
            load(at, x + size_t(c) * A_BYTES, A_BYTES, bar);
        };
        const int first = st.k_tiles < STAGES ? st.k_tiles : STAGES;
        if (threadIdx.x == 0) {
          if (exported) { // the ring held accumulators a leader reads
            wait_parity(smem_addr(&freed), (exported - 1) & 1);
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
          }
          for (int c = 0; c < first; ++c)
            fill(c, true, false); // weights before the wait
          wait_for_previous(a, l, g);
          for (int c = 0; c < first; ++c)
            fill(c, false, true); // activations after it
        }
        __syncthreads();
#pragma unroll
        for (int j = 0; j < N; ++j)
          acc.v[j] = 0.f;
        for (int c = 0; c < st.k_tiles; ++c, ++used) {
          unsigned slot = used % STAGES;
          wait_parity(smem_addr(&full[slot]), (used / STAGES) & 1);
          float r = read_stage(ring + slot * SLOT, st.b_bytes);
#pragma unroll
          for (int j = 0; j < N; ++j)
            acc.v[j] += r * float(j + 1);
          __syncthreads(); // the slot is read
          if (threadIdx.x == 0) {
            arrive_local(smem_addr(&empty[slot]));
            if (c + STAGES < st.k_tiles)
              fill(c + STAGES, true, true);
          }
        }
        const size_t block_at = (size_t(l * PER_LAYER + g) * MAX_INSTANCES + block) *
                                size_t(N) * THREADS;
        unsigned *meet = a.meets + (l * PER_LAYER + g) * MAX_INSTANCES + block;
        if (a.variant == L2) {
          float *slots = a.parts + size_t(g) * MAX_INSTANCES * MAX_ACC * THREADS +
                         size_t(block) * st.parts * n * THREADS;
          if (meet_l2(a, acc, n, st.parts, part, slots, meet, last_flag))
            store_block(a, acc, n, block_at);
        } else if (a.variant == DSMEM) {
          const int group = st.parts < C ? st.parts : C; // parts meeting in smem
          const unsigned lead = rank - part % group;     // the group's leader
          float *mine = reinterpret_cast<float *>(ring);
          if (part % group) { // hand the accumulators to the leader
#pragma unroll
            for (int j = 0; j < N / 4; ++j)
              if (j * 4 < n)
                reinterpret_cast<float4 *>(mine)[j * THREADS + threadIdx.x] =
                  make_float4(acc.v[4 * j], acc.v[4 * j + 1], acc.v[4 * j + 2],
                              acc.v[4 * j + 3]);
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
            __syncthreads();
            if (threadIdx.x == 0)
              arrive_remote(peer_addr(smem_addr(&met), lead));
            ++exported;
          } else {
            if (threadIdx.x == 0) {
              for (int q = group; q < C; ++q) // the arrivals no part makes
                arrive_local(smem_addr(&met));
              wait_parity(smem_addr(&met), led & 1);
            }
            ++led;
            __syncthreads();
            asm volatile("fence.acq_rel.cluster;" ::: "memory");
            for (int q = 1; q < group; ++q) // part order
#pragma unroll
              for (int j = 0; j < N / 4; ++j) {
                if (j * 4 >= n)
                  break;
                float4 v = load_remote(peer_addr(
                    smem_addr(mine) + (j * THREADS + threadIdx.x) * 16, rank + q));
                acc.v[4 * j] += v.x, acc.v[4 * j + 1] += v.y;
                acc.v[4 * j + 2] += v.z, acc.v[4 * j + 3] += v.w;
              }
            __syncthreads(); // every peer's accumulators read
            if (threadIdx.x == 0)
              for (int q = 1; q < group; ++q)
                arrive_remote(peer_addr(smem_addr(&freed), rank + q));
            const int groups = st.parts / group;
            if (groups == 1) {
              store_block(a, acc, n, block_at);
            } else { // the groups' leaders meet through the L2
              float *slots = a.parts + size_t(g) * MAX_INSTANCES * MAX_ACC * THREADS +
                             size_t(block) * groups * n * THREADS;
              if (meet_l2(a, acc, n, groups, part / group, slots, meet, last_flag))
                store_block(a, acc, n, block_at);
            }
          }
        }
        __syncthreads();
        if (threadIdx.x == 0)
          done(a, l, g);
      }
      w_at += size_t(count) * st.k_tiles * st.b_bytes;
    }
  }
  if (C > 1)
    cluster_sync(); // no peer still reads this CTA's memory or arrives here
}

// One hand-over a round between CTA 1 (the part) and CTA 0 (the leader).
template <bool CLUSTER>
__global__ void __launch_bounds__(THREADS, 1) ping(float *slot, unsigned *flags, int rounds,
                                                   float *sink) {
  __shared__ __align__(16) float4 mine[1024]; // 16 KB of accumulators
  __shared__ __align__(8) unsigned long long met, freed;
  const unsigned rank = CLUSTER ? cluster_rank() : blockIdx.x;
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(&met)));
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(&freed)));
    asm volatile("fence.mbarrier_init.release.cluster;");
  }
  if (CLUSTER)
    cluster_sync();
  else
    __syncthreads();
  float acc = 0.f;
  for (int r = 0; r < rounds; ++r) {
    if (rank == 1) { // store, hand over, wait for the buffer to come back
      float4 v = make_float4(r, acc, 1.f, 2.f);
      for (int j = threadIdx.x; j < 1024; j += THREADS) {
        if (CLUSTER)
          mine[j] = v;
        else
          reinterpret_cast<float4 *>(slot)[j] = v;
      }
      __syncthreads();
      if (threadIdx.x == 0) {
        if (CLUSTER) {
          arrive_remote(peer_addr(smem_addr(&met), 0));
          wait_parity(smem_addr(&freed), r & 1);
        } else {
          count_one(flags);
          wait_count(flags + 1, r + 1);
        }
      }
      __syncthreads();
    } else if (rank == 0) { // wait, read and add, hand back
      if (threadIdx.x == 0) {
        if (CLUSTER) {
          wait_parity(smem_addr(&met), r & 1);
        } else {
          wait_count(flags, r + 1);
        }
      }
      __syncthreads();
      for (int j = threadIdx.x; j < 1024; j += THREADS) {
        float4 v = CLUSTER ? load_remote(peer_addr(smem_addr(&mine[j]), 1))
                           : load_l2(slot + 4 * j);
        acc += v.x + v.y;
      }
      __syncthreads();
      if (threadIdx.x == 0) {
        if (CLUSTER)
          arrive_remote(peer_addr(smem_addr(&freed), 1));
        else
          count_one(flags + 1);
      }
    }
  }
  if (CLUSTER)
    cluster_sync();
  if (acc == 1.2345e-30f)
    sink[0] = acc;
}

template <int C, int N> void prepare(size_t smem) {
  CHECK(cudaFuncSetAttribute(projections<C, N>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(smem)));
  if (C > 1)
    CHECK(cudaFuncSetAttribute(projections<C, N>,
                               cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
}

int main() {
  int sms;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int grid = 2 * sms;
  // qkv 3072 columns, o_proj 2048, gate/up 16384 weight rows, down 2048 (k 8192).
  const Stage stages[PER_LAYER] = {
      {48, 4, 8, 64 * 64 * 2},
      {32, 4, 8, 64 * 64 * 2},
      {128, 2, 16, 128 * 64 * 2},
      {32, 8, 16, 64 * 64 * 2},
  };
  CHECK(cudaMemcpyToSymbol(c_stages, stages, sizeof(stages)));
  size_t layer = 0;
  for (const Stage &s : stages) {
    layer += size_t(s.blocks) * s.parts * s.k_tiles * s.b_bytes;
    if (s.blocks * s.parts > grid || s.blocks * s.parts > MAX_INSTANCES) {
      std::printf("a stage of %d instances needs one a CTA (grid %d): stop\n",
                  s.blocks * s.parts, grid);
      return 1;
    }
  }
  const size_t total = layer * LAYERS;
  char *w, *act;
  float *parts;
  unsigned short *out;
  unsigned *counters, *meets;
  const size_t meet_words = size_t(LAYERS) * PER_LAYER * MAX_INSTANCES;
  CHECK(cudaMalloc(&w, total));
  CHECK(cudaMemset(w, 0x3c, total));
  CHECK(cudaMalloc(&act, PER_LAYER * 64 * 8192 * 2));
  CHECK(cudaMemset(act, 0x3c, PER_LAYER * 64 * 8192 * 2));
  CHECK(cudaMalloc(&parts, size_t(PER_LAYER) * MAX_INSTANCES * MAX_ACC * THREADS * 4));
  CHECK(cudaMalloc(&out, meet_words * MAX_ACC * THREADS * 2));
  CHECK(cudaMalloc(&counters, LAYERS * PER_LAYER * 4));
  CHECK(cudaMalloc(&meets, meet_words * 4));
  const double bw = copy_bandwidth_tbps();
  std::printf("grid %d CTAs (2 a SM), weights %.1f MB a layer, copy bandwidth "
              "%.2f TB/s: %.1f us a layer at it\n",
              grid, layer / 1e6, bw, layer / (bw * 1e12) * 1e6);
  const size_t smem = size_t(STAGES) * SLOT;
  prepare<1, MAX_ACC>(smem);
  prepare<2, MAX_ACC>(smem);
  prepare<4, MAX_ACC>(smem);
  prepare<8, MAX_ACC>(smem);
  struct Run {
    const char *name;
    int variant, cluster;
  };
  const Run runs[] = {{"N no meeting (bound)", NONE, 1},
                      {"L meeting in L2", L2, 1},
                      {"D2 smem, clusters of 2", DSMEM, 2},
                      {"D4 smem, clusters of 4", DSMEM, 4},
                      {"D8 smem, clusters of 8", DSMEM, 8}};
  for (int pass = 0; pass < 2; ++pass)
    for (const Run &r : runs) {
      cudaLaunchConfig_t cfg = {};
      cudaLaunchAttribute attr[1];
      attr[0].id = cudaLaunchAttributeClusterDimension;
      attr[0].val.clusterDim.x = r.cluster;
      attr[0].val.clusterDim.y = 1;
      attr[0].val.clusterDim.z = 1;
      cfg.gridDim = dim3(grid);
      cfg.blockDim = dim3(THREADS);
      cfg.dynamicSmemBytes = smem;
      cfg.attrs = attr;
      cfg.numAttrs = r.cluster > 1 ? 1 : 0;
      auto kernel = r.cluster == 1   ? projections<1, MAX_ACC>
                    : r.cluster == 2 ? projections<2, MAX_ACC>
                    : r.cluster == 4 ? projections<4, MAX_ACC>
                                     : projections<8, MAX_ACC>;
      if (r.cluster > 1) {
        int clusters = 0;
        CHECK(cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg));
        if (clusters * r.cluster < grid) {
          std::printf("pass %d  %-26s only %d clusters resident (the grid "
                      "needs %d): skipped\n",
                      pass + 1, r.name, clusters, grid / r.cluster);
          continue;
        }
      }
      Args a{w, act, parts, out, counters, meets, 0, r.variant};
      CHECK(cudaMemset(counters, 0, LAYERS * PER_LAYER * 4));
      CHECK(cudaMemset(meets, 0, meet_words * 4));
      float us = median_us([&] {
        CHECK(cudaLaunchKernelEx(&cfg, kernel, a));
        a.epoch++;
      });
      CHECK(cudaGetLastError());
      CHECK(cudaDeviceSynchronize());
      std::printf("pass %d  %-26s %8.1f us  %6.2f us a layer  weights at %.2f "
                  "TB/s (%.0f%% of copy)\n",
                  pass + 1, r.name, us, us / LAYERS, total / (us * 1e-6) / 1e12,
                  100 * total / (us * 1e-6) / 1e12 / bw);
    }
  // One meeting alone: 1000 hand-overs of 16 KB and back, two CTAs.
  const int rounds = 1000;
  unsigned *flags;
  CHECK(cudaMalloc(&flags, 8));
  for (int cluster : {0, 1}) {
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = 2;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.gridDim = dim3(2);
    cfg.blockDim = dim3(THREADS);
    cfg.attrs = attr;
    cfg.numAttrs = cluster;
    float us = median_us([&] {
      CHECK(cudaMemset(flags, 0, 8));
      if (cluster)
        CHECK(cudaLaunchKernelEx(&cfg, ping<true>, parts, flags, rounds, (float *)out));
      else
        CHECK(cudaLaunchKernelEx(&cfg, ping<false>, parts, flags, rounds, (float *)out));
    });
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    std::printf("ping  %-26s %6.3f us a round (16 KB handed over and back)\n",
                cluster ? "shared memory, cluster of 2" : "L2, two CTAs", us / rounds);
  }
  return 0;
}
