// RUN: etc-opt %s -split-input-file --etensor-static-schedule --convert-etensor-to-gpu="convergent-reductions=true" | FileCheck %s
// RUN: etc-opt %s -split-input-file --etensor-static-schedule --convert-etensor-to-gpu | FileCheck %s --check-prefix=OFF

/// convergent-reductions: in a kernel with aligned barriers the scheduler's
/// CTA reductions (here the wait's `or` over the failed polls) are
/// nvvm.barrier with a reduction, a call LLVM treats as convergent, instead
/// of inline `bar.red` asm, which LLVM may sink or duplicate into divergent
/// code. Off, the inline asm stays.
func.func @producer(%i: index, %w: memref<?xf32>) {
  return
}
func.func @tile(%i: index, %w: memref<?xf32>) {
  return
}

// CHECK-LABEL: gpu.func @lists
// CHECK: ld.acquire.gpu.global.u32
// CHECK: nvvm.barrier #nvvm.reduction<or> %{{.*}} -> i32
// CHECK-NOT: bar.red
// CHECK: func.call @tile(
// OFF-LABEL: gpu.func @lists
// OFF-NOT: nvvm.barrier #nvvm.reduction
// OFF: bar.red.or.pred
etensor.graph @lists(%n: index, %w: memref<?xf32>) {
  %e = etensor.event() count 1 : !etensor.event<1>
  etensor.task @producer grid [1] args(%w : memref<?xf32>) outs(%e[(i) -> (0)] : !etensor.event<1>)
  etensor.task @tile grid [%n] args(%w : memref<?xf32>) ins(%e[(i) -> (0)] : !etensor.event<1>)
}

// -----

/// A kernel that draws (a ticket) keeps its non-aligned `barrier.red`: NVVM
/// has no op for it.
func.func @plan(%i: index) { return }
func.func @tile(%i: index) { return }
func.func @sink(%i: index) { return }
// CHECK-LABEL: gpu.func @balanced
// CHECK-NOT: nvvm.barrier #nvvm.reduction
// CHECK: barrier.red.or.pred
etensor.graph @balanced(%n: index) {
  %planned = etensor.event() count 1 {name = "planned"} : !etensor.event<1>
  %done = etensor.event() count %n {name = "done"} : !etensor.event<1>
  etensor.task @plan grid [1] outs(%planned[(i) -> (0)] : !etensor.event<1>)
  etensor.task @tile grid [%n] ins(%planned[(i) -> (0)] : !etensor.event<1>) outs(%done[(i) -> (0)] : !etensor.event<1>) {ticketed}
  etensor.task @sink grid [1] ins(%done[(i) -> (0)] : !etensor.event<1>)
}
