// RUN: etc-opt %s --etc-static-to-ptx | FileCheck %s
// RUN: etc-opt %s --etc-static-to-ptx="chip=sm_90a features=+ptx80 block-size=128" | FileCheck %s --check-prefix=SM90A
// RUN: etc-opt %s --etc-static-to-ptx="min-ctas-per-sm=2" | FileCheck %s --check-prefix=OCC
// RUN: etc-opt %s --etc-static-to-ptx="convergent-reductions=true" | FileCheck %s --check-prefix=CONV

/// The registered pipeline takes a graph all the way to a gpu.binary holding
/// PTX for the chosen chip, with the synchronisation instructions intact and
/// the device functions inlined into the kernel.

/// convergent-reductions: the wait's `bar.red.or` comes from the NVVM
/// intrinsic (LLVM's own predicate registers), not from the inline asm.
// CONV: bar.red.or.pred \09%p{{[0-9]+}}, 0, %p{{[0-9]+}}
// CONV-NOT: bar.red.or.pred %p, 0, %p

func.func @partial(%i: index, %j: index, %a: memref<?x4xf32>) {
  %tid = gpu.thread_id x
  %c0 = arith.constant 0 : index
  %first = arith.cmpi eq, %tid, %c0 : index
  scf.if %first {
    %one = arith.constant 1.0 : f32
    memref.store %one, %a[%i, %j] : memref<?x4xf32>
  }
  return
}
func.func @final(%i: index, %a: memref<?x4xf32>, %c: memref<?xf32>) {
  %c0 = arith.constant 0 : index
  %v = memref.load %a[%i, %c0] : memref<?x4xf32>
  memref.store %v, %c[%i] : memref<?xf32>
  return
}

// CHECK-NOT: etensor.
// CHECK-NOT: func.func
// CHECK-NOT: globaltimer
// CHECK: gpu.binary @splitk_kernels
// CHECK-SAME: chip = "sm_90"
// CHECK-SAME: .target sm_90
// CHECK-SAME: .visible .entry splitk(
// CHECK-SAME: .maxntid 256, 1, 1
// CHECK-SAME: red.release.gpu.global.add.u32
// CHECK-SAME: ld.acquire.gpu.global.u32
// CHECK-SAME: nanosleep.u32
// CHECK-SAME: bar.red.or.pred
// SM90A: chip = "sm_90a"
// SM90A-SAME: .maxntid 128, 1, 1
/// min-ctas-per-sm asks ptxas for resident CTAs (it caps the registers).
// OCC: .maxntid 256, 1, 1
// OCC-SAME: .minnctapersm 2
etensor.graph @splitk(%n: index, %a: memref<?x4xf32>, %c: memref<?xf32>) {
  %e = etensor.event(%n) count 4 : !etensor.event<?>
  etensor.task @partial grid [%n, 4] args(%a : memref<?x4xf32>) outs(%e[(i, j) -> (i)] : !etensor.event<?>)
  etensor.task @final grid [%n] args(%a, %c : memref<?x4xf32>, memref<?xf32>) ins(%e[(i) -> (i)] : !etensor.event<?>)
}
