// RUN: etc-opt %s -split-input-file -verify-diagnostics --etensor-static-schedule | FileCheck %s

func.func private @produce(%i: index, %j: index, %a: memref<?x4xf32>)
func.func private @consume(%i: index, %a: memref<?x4xf32>)

/// Tasks are numbered in topological order, not graph order: the consumer is
/// written first but becomes task 1.
// CHECK-LABEL: etensor.graph @numbering
// CHECK-SAME: (%[[N:.*]]: index, %[[A:.*]]: memref<?x4xf32>)
// CHECK: %[[E:.*]] = etensor.event(%[[N]]) count 4
// CHECK-NOT: etensor.task
// CHECK: etensor.worker static {
// CHECK-NEXT: etensor.dispatch 0 grid [%[[N]], 4] attributes {name = "produce"} {
// CHECK-NEXT: ^bb0(%[[I:.*]]: index, %[[J:.*]]: index):
// CHECK-NEXT: func.call @produce(%[[I]], %[[J]], %[[A]])
// CHECK-NEXT: etensor.notify %[[E]][%[[I]]] : !etensor.event<?>
// CHECK-NEXT: }
// CHECK-NEXT: etensor.dispatch 1 grid [%[[N]]] attributes {name = "consume"} {
// CHECK-NEXT: ^bb0(%[[K:.*]]: index):
// CHECK-NEXT: etensor.wait %[[E]][%[[K]]] : !etensor.event<?>
// CHECK-NEXT: func.call @consume(%[[K]], %[[A]])
etensor.graph @numbering(%n: index, %a: memref<?x4xf32>) {
  %e = etensor.event(%n) count 4 : !etensor.event<?>
  etensor.task @consume grid [%n] args(%a : memref<?x4xf32>) ins(%e[(i) -> (i)] : !etensor.event<?>)
  etensor.task @produce grid [%n, 4] args(%a : memref<?x4xf32>) outs(%e[(i, j) -> (i)] : !etensor.event<?>)
}

// -----

func.func private @tile(%i: index)

/// Non-identity maps are expanded to index arithmetic; a task waits on every
/// in-edge before its body and notifies every out-edge after it.
// CHECK-LABEL: etensor.graph @several_edges
// CHECK: etensor.dispatch 1
// CHECK-NEXT: ^bb0(%[[I:.*]]: index):
// CHECK-NEXT: etensor.wait %{{.*}}[%[[I]]]
// CHECK: %[[HALF:.*]] = arith.divsi
// CHECK: %[[FLOOR:.*]] = arith.select %{{.*}}, %{{.*}}, %[[HALF]]
// CHECK-NEXT: etensor.wait %{{.*}}[%[[FLOOR]]]
// CHECK-NEXT: func.call @tile(%[[I]])
// CHECK-NEXT: etensor.notify
// CHECK-NEXT: etensor.notify
etensor.graph @several_edges(%n: index, %h: index) {
  %a = etensor.event(%n) count 1 : !etensor.event<?>
  %b = etensor.event(%h) count 1 : !etensor.event<?>
  %c = etensor.event(%n) count 1 : !etensor.event<?>
  %d = etensor.event(%n) count 1 : !etensor.event<?>
  etensor.task @tile grid [%n] outs(%a[(i) -> (i)] : !etensor.event<?>, %b[(i) -> (i floordiv 2)] : !etensor.event<?>)
  etensor.task @tile grid [%n] ins(%a[(i) -> (i)] : !etensor.event<?>, %b[(i) -> (i floordiv 2)] : !etensor.event<?>) outs(%c[(i) -> (i)] : !etensor.event<?>, %d[(i) -> (i)] : !etensor.event<?>)
  etensor.task @tile grid [%n] ins(%c[(i) -> (i)] : !etensor.event<?>, %d[(i) -> (i)] : !etensor.event<?>)
}

// -----

func.func private @tile(%i: index)

etensor.graph @triggers_rejected(%n: index, %p: memref<?xi32>) {
  %e = etensor.event(%n) count 1 : !etensor.event<?>
  etensor.task @tile grid [%n] outs(%e[(i) -> (i)] : !etensor.event<?>)
  // expected-error @+1 {{data-dependent triggers are not supported by etensor-static-schedule yet}}
  etensor.task @tile grid [%n] triggered_by(%e, %p : !etensor.event<?>, memref<?xi32>)
}

// -----

func.func private @tile(%i: index)

// expected-error @+1 {{has a dependency cycle; run etensor-verify-graph for details}}
etensor.graph @cycle_rejected(%n: index) {
  %e = etensor.event(%n) count 1 : !etensor.event<?>
  etensor.task @tile grid [%n] ins(%e[(i) -> (i)] : !etensor.event<?>) outs(%e[(i) -> (i)] : !etensor.event<?>)
}
