// RUN: etc-opt %s --etensor-static-schedule --convert-etensor-to-gpu="prefetch-next=true" | FileCheck %s
// RUN: etc-opt %s --etensor-dynamic-schedule --convert-etensor-to-gpu | FileCheck %s --check-prefix=DYN

/// A task with `prefetch_after = 1` runs its prefetch after its first wait,
/// only when that wait succeeded (the prefetch reads what its producer
/// wrote), and before its second wait; prefetch-next never runs it for the
/// next queue entry (it would run before that entry's waits).
func.func @producer(%i: index, %w: memref<?xf32>) {
  return
}
func.func @tile(%i: index, %w: memref<?xf32>) {
  return
}
func.func @tile__prefetch(%i: index, %w: memref<?xf32>) {
  return
}

// CHECK-LABEL: gpu.func @prefetched_after
// CHECK-NOT: func.call @tile__prefetch
// CHECK: scf.index_switch
// CHECK: case 2 {
// CHECK-NOT: func.call @tile__prefetch
// CHECK: ld.acquire.gpu.global.u32
// CHECK: bar.red.or.pred
// CHECK: %[[DONE:.*]] = arith.cmpi eq
// CHECK-NEXT: %[[OK:.*]] = arith.andi %{{.*}}, %[[DONE]] : i1
// CHECK-NEXT: scf.if %[[OK]] {
// CHECK-NEXT: func.call @tile__prefetch
// CHECK: ld.acquire.gpu.global.u32
// CHECK: func.call @tile(
// Dynamic schedule (early push: the instance is popped once its producers
// are dispatched): the same order inside the instance.
// DYN-LABEL: gpu.func @prefetched_after
// DYN: case 2 {
// DYN-NOT: func.call @tile__prefetch
// DYN: ld.acquire.gpu.global.u32
// DYN: bar.red.or.pred
// DYN: %[[DYNOK:.*]] = arith.andi
// DYN-NEXT: scf.if %[[DYNOK]] {
// DYN-NEXT: func.call @tile__prefetch
// DYN: ld.acquire.gpu.global.u32
// DYN: func.call @tile(
etensor.graph @prefetched_after(%n: index, %w: memref<?xf32>) {
  %table = etensor.event() count 1 : !etensor.event<1>
  %rows = etensor.event() count 1 : !etensor.event<1>
  etensor.task @producer grid [1] args(%w : memref<?xf32>) outs(%table[(i) -> (0)] : !etensor.event<1>)
  etensor.task @producer grid [1] args(%w : memref<?xf32>) outs(%rows[(i) -> (0)] : !etensor.event<1>)
  etensor.task @tile grid [%n] args(%w : memref<?xf32>) ins(%table[(i) -> (0)] : !etensor.event<1>, %rows[(i) -> (0)] : !etensor.event<1>) {prefetch = @tile__prefetch, prefetch_after = 1}
}
