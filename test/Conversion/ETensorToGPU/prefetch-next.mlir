// RUN: etc-opt %s --etensor-static-schedule --convert-etensor-to-gpu="prefetch-next=true" | FileCheck %s
// RUN: etc-opt %s --etensor-static-schedule --convert-etensor-to-gpu | FileCheck %s --check-prefix=OFF

/// With prefetch-next, every queue entry first runs the prefetch function of
/// the CTA's next entry (if it is in this CTA's slice and its task has one),
/// then its own instance: its prefetch, its waits, its tile.
func.func @producer(%i: index, %w: memref<?xf32>) {
  return
}
func.func @tile(%i: index, %w: memref<?xf32>) {
  return
}
func.func @tile__prefetch(%i: index, %w: memref<?xf32>) {
  return
}

// CHECK-LABEL: gpu.func @prefetched
// CHECK: scf.for %[[POS:.*]] = %[[BEGIN:.*]] to %[[END:.*]] step
// CHECK: %[[NEXT:.*]] = arith.addi %[[POS]], %{{.*}} : index
// CHECK: %[[IN:.*]] = arith.cmpi ult, %[[NEXT]], %[[END]] : index
// CHECK: scf.if %[[IN]] {
// CHECK: %[[ENTRY:.*]] = memref.load %{{.*}}[%[[NEXT]]]
// CHECK: scf.index_switch
// Only the task with a prefetch function has a case (task 1); the producer has none.
// CHECK-NEXT: case 1 {
// CHECK-NOT: ld.acquire
// CHECK: func.call @tile__prefetch
// CHECK-NOT: ld.acquire
// CHECK: scf.yield
// CHECK-NEXT: }
// CHECK-NEXT: default {
// CHECK-NEXT: }
// The entry's own instance follows: the producer's case, then the tile's,
// whose own prefetch call comes before its wait.
// CHECK: scf.index_switch
// CHECK: case 0 {
// CHECK: func.call @producer
// CHECK: case 1 {
// CHECK: func.call @tile__prefetch
// CHECK: ld.acquire.gpu.global.u32
// CHECK: func.call @tile(

// OFF-LABEL: gpu.func @prefetched
// OFF-COUNT-1: func.call @tile__prefetch
// OFF-NOT: func.call @tile__prefetch
etensor.graph @prefetched(%n: index, %w: memref<?xf32>) {
  %e = etensor.event() count 1 : !etensor.event<1>
  etensor.task @producer grid [1] args(%w : memref<?xf32>) outs(%e[(i) -> (0)] : !etensor.event<1>)
  etensor.task @tile grid [%n] args(%w : memref<?xf32>) ins(%e[(i) -> (0)] : !etensor.event<1>) {prefetch = @tile__prefetch}
}
