// RUN: etc-opt %s --etc-dynamic-to-ptx | FileCheck %s
// RUN: etc-opt %s --etc-dynamic-to-ptx="early-push=false" | FileCheck %s --check-prefix=LATE

/// The dynamic pipeline ends in PTX with the ready-queue instructions; with
/// early push the consumer also polls the completion counter.

func.func @partial(%i: index, %j: index, %a: memref<?x4xf32>) {
  %one = arith.constant 1.0 : f32
  memref.store %one, %a[%i, %j] : memref<?x4xf32>
  return
}
func.func @final(%i: index, %a: memref<?x4xf32>, %c: memref<?xf32>) {
  %c0 = arith.constant 0 : index
  %v = memref.load %a[%i, %c0] : memref<?x4xf32>
  memref.store %v, %c[%i] : memref<?xf32>
  return
}

/// Early push: the consumer polls the completion counter (ld.acquire.u32)
/// after being pushed at the producers' dispatch.
// CHECK: gpu.binary @splitk_kernels
// CHECK-SAME: atom.relaxed.gpu.global.add.u64
// CHECK-SAME: ld.acquire.gpu.global.u64
// CHECK-SAME: atom.acq_rel.gpu.global.add.u32
// CHECK-SAME: fence.acq_rel.gpu
// CHECK-SAME: st.relaxed.gpu.global.u64
// CHECK-SAME: ld.acquire.gpu.global.u32
/// Push on completion: the completing notification pushes, nobody polls a
/// counter.
// LATE: gpu.binary @splitk_kernels
// LATE-SAME: atom.relaxed.gpu.global.add.u64
// LATE-SAME: ld.acquire.gpu.global.u64
// LATE-SAME: atom.acq_rel.gpu.global.add.u32
// LATE-SAME: fence.acq_rel.gpu
// LATE-SAME: st.relaxed.gpu.global.u64
// LATE-NOT: ld.acquire.gpu.global.u32
etensor.graph @splitk(%n: index, %a: memref<?x4xf32>, %c: memref<?xf32>) {
  %e = etensor.event(%n) count 4 : !etensor.event<?>
  etensor.task @partial grid [%n, 4] args(%a : memref<?x4xf32>) outs(%e[(i, j) -> (i)] : !etensor.event<?>)
  etensor.task @final grid [%n] args(%a, %c : memref<?x4xf32>, memref<?xf32>) ins(%e[(i) -> (i)] : !etensor.event<?>)
}
