// The PTX the standalone stage models in bench/ share (multicast_proto.cu,
// meeting_proto.cu): shared-memory addresses, mbarrier waits and arrivals
// (local and across a cluster), bulk copies, the cluster barrier, and the
// acquire polls and release adds by which their stages wait for each other.
#pragma once

__device__ __forceinline__ unsigned smem_addr(const void *p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
// Until the mbarrier at `bar` completes the phase of parity `parity`.
__device__ __forceinline__ void wait_parity(unsigned bar, unsigned parity) {
  asm volatile(
      "{\n .reg .pred p;\n W: mbarrier.try_wait.parity.acquire."
      "cluster.shared::cta.b64 p, [%0], %1;\n @!p bra W;\n}" ::"r"(bar),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void expect(unsigned bar, int bytes) {
  asm volatile(
      "mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar),
      "r"(bytes)
      : "memory");
}
// `bytes` from `src` to this CTA's `dst`, counted on its barrier `bar`.
__device__ __forceinline__ void load(unsigned dst, const void *src, int bytes,
                                     unsigned bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::"
               "bytes [%0], [%1], %2, [%3];" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}
__device__ __forceinline__ unsigned cluster_rank() {
  unsigned rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  return rank;
}
// `addr` (this CTA's shared memory) in the cluster's CTA `rank`.
__device__ __forceinline__ unsigned peer_addr(unsigned addr, unsigned rank) {
  unsigned out;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
               : "=r"(out)
               : "r"(addr), "r"(rank));
  return out;
}
__device__ __forceinline__ void arrive_local(unsigned bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar)
               : "memory");
}
// An arrival on another CTA's barrier (`peer_addr`), releasing this thread's
// (and, after a CTA barrier, its CTA's) writes at cluster scope.
__device__ __forceinline__ void arrive_remote(unsigned bar) {
  asm volatile(
      "mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" ::"r"(bar)
      : "memory");
}
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n"
               "barrier.cluster.wait.acquire.aligned;" ::
                   : "memory");
}
// Until the u32 at `counter` reaches `need` (acquire, GPU scope).
__device__ __forceinline__ void wait_count(const unsigned *counter,
                                           unsigned need) {
  unsigned seen;
  do {
    asm volatile("ld.acquire.gpu.u32 %0, [%1];"
                 : "=r"(seen)
                 : "l"(counter)
                 : "memory");
  } while (seen < need);
}
// One more on the u32 at `counter` (release, GPU scope).
__device__ __forceinline__ void count_one(unsigned *counter) {
  asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(counter)
               : "memory");
}
