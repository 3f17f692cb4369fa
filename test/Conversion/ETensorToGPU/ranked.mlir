// RUN: etc-opt %s -split-input-file --etensor-static-schedule --convert-etensor-to-gpu | FileCheck %s --check-prefix=STATIC
// RUN: etc-opt %s -split-input-file --etensor-dynamic-schedule --convert-etensor-to-gpu | FileCheck %s --check-prefix=DYNAMIC
// RUN: etc-opt %s -split-input-file --etensor-static-schedule --convert-etensor-to-gpu="trace=true" | FileCheck %s --check-prefix=TRACE

func.func @gemm(%d: index, %i: index, %rank: index, %p: memref<?xi64>) {
  return
}
func.func @reduce(%i: index, %rank: index, %out: memref<?xf32>) {
  return
}
func.func @finish(%i: index) {
  return
}

/// A reduce-scatter over ranks: `gemm` notifies rank d's copy of `rs`,
/// `reduce` waits on its own rank's copy, then notifies a local event.
/// A graph with a ranked event takes one more kernel argument after the
/// watchdog bound: `peers`, the address of every rank's counters.
// STATIC-LABEL: gpu.func @gemm_rs
// STATIC-SAME: (%{{[^:]*}}: index, %[[RANK:[^:]*]]: index, %{{[^:]*}}: index, %{{[^:]*}}: memref<?xi64>, %{{[^:]*}}: memref<?xf32>, %[[COUNTERS:[^:]*]]: memref<?xi32>, %{{[^:]*}}: memref<?xi64>, %[[STATUS:[^:]*]]: memref<?xi32>, %[[POLLS:[^:]*]]: index, %[[PEERS:[^:]*]]: memref<?xi64>) kernel
/// The rank barrier: CTA 0's thread 0 adds one to every rank's arrivals word
/// (system scope, through the peer's counters address)...
// STATIC: %[[RANKS:.*]] = memref.dim %[[PEERS]], %{{.*}} : memref<?xi64>
// STATIC: gpu.block_id x
// STATIC: scf.for %[[R:.*]] = %{{.*}} to %[[RANKS]] step
// STATIC-NEXT: memref.load %[[PEERS]][%[[R]]] : memref<?xi64>
// STATIC: "red.release.sys.global.add.u32 [$0], 1;"
/// ...then every CTA's thread 0 reads the launches this rank finished and
/// polls its own arrivals word for ranks * (launches + 1), under the
/// watchdog (event -2)...
// STATIC: "ld.relaxed.gpu.global.u32 $0, [$1];"
// STATIC: arith.muli %{{.*}}, %{{.*}} : i32
// STATIC: scf.while
// STATIC: "ld.acquire.sys.global.u32 $0, [$1];"
// STATIC: arith.constant -2 : i32
// STATIC: memref.store %{{.*}}, %[[STATUS]]
/// ...and the CTA runs its tasks only if every rank arrived.
// STATIC: bar.red.or.pred
// STATIC: %[[ARRIVED:.*]] = arith.cmpi eq, %{{.*}}, %{{.*}} : i32
// STATIC-NEXT: scf.if %[[ARRIVED]] {
// STATIC: scf.index_switch
/// notify on a ranked event: the address of coordinate 0's copy, a CTA
/// barrier, a system-scope release.
// STATIC: case 0 {
// STATIC: func.call @gemm(%[[D:.*]], %{{.*}}, %[[RANK]], %{{.*}})
// STATIC: memref.load %[[PEERS]][%[[D]]] : memref<?xi64>
// STATIC: gpu.barrier
// STATIC: "red.release.sys.global.add.u32 [$0], 1;"
/// wait on a ranked event: this rank's own copy, polled at system scope; the
/// local event is notified at GPU scope in this rank's counters.
// STATIC: case 1 {
// STATIC: arith.addi %{{.*}}, %[[RANK]] : index
// STATIC: "ld.acquire.sys.global.u32 $0, [$1];"
// STATIC: func.call @reduce(%{{.*}}, %[[RANK]], %{{.*}})
// STATIC-NOT: memref.load %[[PEERS]]
// STATIC: "red.release.gpu.global.add.u32 [$0], 1;"
// STATIC: case 2 {
// STATIC: "ld.acquire.gpu.global.u32 $0, [$1];"
// STATIC: func.call @finish
// STATIC: default {
/// The last CTA resets the counters and counts one more finished launch.
// STATIC: "atom.acq_rel.gpu.global.add.u32 $0, [$1], 1;"
// STATIC: memref.store %{{.*}}, %[[COUNTERS]]
// STATIC: "red.relaxed.gpu.global.add.u32 [$0], 1;"
// STATIC: gpu.return

/// Dynamic: the same barrier comes before the first pop; the ranked notify
/// is a plain system-scope release (no completion, no push); `reduce` pushes
/// `finish` through `dispatched.done` (early push) before it waits on its
/// rank's copy of `rs`.
// DYNAMIC-LABEL: gpu.func @gemm_rs
// DYNAMIC-SAME: %[[POLLS:[^:]*]]: index, %[[PEERS:[^:]*]]: memref<?xi64>) kernel
// DYNAMIC: scf.for %[[R:.*]] = %{{.*}} to %{{.*}} step
// DYNAMIC-NEXT: memref.load %[[PEERS]][%[[R]]] : memref<?xi64>
// DYNAMIC: "red.release.sys.global.add.u32 [$0], 1;"
// DYNAMIC: "ld.acquire.sys.global.u32 $0, [$1];"
// DYNAMIC: bar.red.or.pred
// DYNAMIC: "atom.relaxed.gpu.global.add.u64 $0, [$1], $2;"
// DYNAMIC: case 0 {
// DYNAMIC: func.call @gemm
// DYNAMIC: memref.load %[[PEERS]]
// DYNAMIC-NOT: atom.acq_rel
// DYNAMIC: "red.release.sys.global.add.u32 [$0], 1;"
// DYNAMIC: case 1 {
// DYNAMIC: "atom.acq_rel.gpu.global.add.u32 $0, [$1], 1;"
// DYNAMIC: "ld.acquire.sys.global.u32 $0, [$1];"
// DYNAMIC: func.call @reduce
// DYNAMIC: "red.release.gpu.global.add.u32 [$0], 1;"
// DYNAMIC: case 2 {
// DYNAMIC: func.call @finish
// DYNAMIC: "red.relaxed.gpu.global.add.u32 [$0], 1;"
// DYNAMIC: gpu.return

/// With trace=true the trace buffer comes after `peers`.
// TRACE-LABEL: gpu.func @gemm_rs
// TRACE-SAME: %[[POLLS:[^:]*]]: index, %[[PEERS:[^:]*]]: memref<?xi64>, %[[TRACE:[^:]*]]: memref<?xi64>) kernel
// TRACE: memref.load %[[PEERS]]
// TRACE: "mov.u64 $0, %globaltimer;"
// TRACE: memref.store %{{.*}}, %[[TRACE]]
etensor.graph @gemm_rs(%ranks: index, %rank: index, %tiles: index, %p: memref<?xi64>, %out: memref<?xf32>) {
  %rs = etensor.event(%ranks, %tiles) count %ranks ranked {name = "rs"} : !etensor.event<?x?>
  %done = etensor.event(%tiles) count 1 {name = "done"} : !etensor.event<?>
  etensor.task @gemm grid [%ranks, %tiles] rank(%rank) args(%rank, %p : index, memref<?xi64>) outs(%rs[(d, i) -> (d, i)] : !etensor.event<?x?>)
  etensor.task @reduce grid [%tiles] rank(%rank) args(%rank, %out : index, memref<?xf32>) ins(%rs[(i)[r] -> (r, i)] : !etensor.event<?x?>) outs(%done[(i) -> (i)] : !etensor.event<?>)
  etensor.task @finish grid [%tiles] ins(%done[(i) -> (i)] : !etensor.event<?>)
}

// -----

func.func @tile(%i: index) {
  return
}

/// Without a ranked event nothing changes, even when a task names its rank:
/// no `peers` argument, no rank barrier, no launches word, no system scope.
// STATIC-LABEL: gpu.func @local_rank
// STATIC-SAME: %{{[^:]*}}: memref<?xi32>, %{{[^:]*}}: index) kernel
// STATIC-NOT: memref.dim
// STATIC: "ld.acquire.gpu.global.u32 $0, [$1];"
// STATIC-NOT: .sys
// STATIC-NOT: red.relaxed.gpu.global.add.u32
// STATIC: gpu.return
// STATIC-NOT: .sys
// DYNAMIC-LABEL: gpu.func @local_rank
// DYNAMIC-SAME: %{{[^:]*}}: memref<?xi32>, %{{[^:]*}}: index) kernel
// DYNAMIC-NOT: .sys
// DYNAMIC-NOT: red.relaxed.gpu.global.add.u32
// DYNAMIC: gpu.return
// DYNAMIC-NOT: .sys
// TRACE-LABEL: gpu.func @local_rank
// TRACE-SAME: %{{[^:]*}}: memref<?xi32>, %{{[^:]*}}: index, %{{[^:]*}}: memref<?xi64>) kernel
// TRACE-NOT: .sys
etensor.graph @local_rank(%rank: index, %n: index) {
  %e = etensor.event() count 1 : !etensor.event<4>
  etensor.task @tile grid [4] outs(%e[(i) -> (i)] : !etensor.event<4>)
  etensor.task @tile grid [%n] rank(%rank) ins(%e[(i)[r] -> (r)] : !etensor.event<4>)
}
