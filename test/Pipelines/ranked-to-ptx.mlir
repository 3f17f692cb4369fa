// RUN: etc-opt %s -split-input-file --etc-static-to-ptx | FileCheck %s
// RUN: etc-opt %s -split-input-file --etc-static-to-ptx | FileCheck %s --check-prefix=SCOPE
// RUN: etc-opt %s -split-input-file --etc-dynamic-to-ptx | FileCheck %s --check-prefix=DYN
// RUN: etc-opt %s -split-input-file --etc-dynamic-to-ptx | FileCheck %s --check-prefix=SCOPE

/// Both pipelines take a graph with a ranked event to PTX: system-scope
/// releases (notifications of peers' counters, the rank barrier's arrivals)
/// and acquires (waits, the barrier's poll), and the launches count. The
/// block layout is LLVM's, so the instructions are checked in any order.

func.func @gemm(%d: index, %i: index, %rank: index, %p: memref<?xi64>) {
  return
}
func.func @reduce(%i: index, %rank: index, %out: memref<?xf32>) {
  return
}

/// `peers` is the last kernel parameter: 13 words for the graph's arguments
/// (a memref is 5), 16 for the counters, queue, status and watchdog bound,
/// 5 for `peers`.
// CHECK-LABEL: gpu.binary @gemm_rs_kernels
// CHECK-SAME: .visible .entry gemm_rs(
// CHECK-SAME: .param .u64 .ptr .align 1 gemm_rs_param_29,
// CHECK-SAME: .param .u64 gemm_rs_param_33\0A)
// CHECK-DAG: red.release.sys.global.add.u32
// CHECK-DAG: ld.acquire.sys.global.u32
// CHECK-DAG: nanosleep.u32
// CHECK-DAG: bar.red.or.pred
// CHECK-DAG: red.relaxed.gpu.global.add.u32
// DYN-LABEL: gpu.binary @gemm_rs_kernels
// DYN-SAME: .param .u64 gemm_rs_param_33\0A)
// DYN-DAG: red.release.sys.global.add.u32
// DYN-DAG: ld.acquire.sys.global.u32
// DYN-DAG: red.relaxed.gpu.global.add.u32
// DYN-DAG: atom.relaxed.gpu.global.add.u64
/// Every counter of a ranked-only graph is reached at system scope.
// SCOPE-LABEL: gpu.binary @gemm_rs_kernels
// SCOPE-NOT: red.release.gpu
// SCOPE-NOT: ld.acquire.gpu.global.u32
etensor.graph @gemm_rs(%ranks: index, %rank: index, %tiles: index, %p: memref<?xi64>, %out: memref<?xf32>) {
  %rs = etensor.event(%ranks, %tiles) count %ranks ranked : !etensor.event<?x?>
  etensor.task @gemm grid [%ranks, %tiles] rank(%rank) args(%rank, %p : index, memref<?xi64>) outs(%rs[(d, i) -> (d, i)] : !etensor.event<?x?>)
  etensor.task @reduce grid [%tiles] rank(%rank) args(%rank, %out : index, memref<?xf32>) ins(%rs[(i)[r] -> (r, i)] : !etensor.event<?x?>)
}

// -----

func.func @tile(%i: index, %rank: index) {
  return
}

/// A graph without ranked events (even with a task naming its rank) keeps
/// its parameters and GPU scope: no `.sys`, no launches count.
// CHECK-LABEL: gpu.binary @local_kernels
// CHECK-SAME: .param .u64 local_param_17\0A)
// DYN-LABEL: gpu.binary @local_kernels
// DYN-SAME: .param .u64 local_param_17\0A)
// SCOPE-LABEL: gpu.binary @local_kernels
// SCOPE-NOT: .sys
// SCOPE-NOT: red.relaxed.gpu.global.add.u32
etensor.graph @local(%rank: index, %n: index) {
  %e = etensor.event() count 1 : !etensor.event<4>
  etensor.task @tile grid [4] rank(%rank) args(%rank : index) outs(%e[(i) -> (i)] : !etensor.event<4>)
  etensor.task @tile grid [%n] rank(%rank) args(%rank : index) ins(%e[(i)[r] -> (r)] : !etensor.event<4>)
}
