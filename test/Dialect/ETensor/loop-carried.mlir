// RUN: etc-opt %s -split-input-file -verify-diagnostics --etensor-verify-graph | FileCheck %s --check-prefix=VERIFY
// RUN: etc-opt %s -split-input-file -verify-diagnostics --etensor-verify-graph --etensor-static-schedule | FileCheck %s --check-prefix=STATIC
// RUN: etc-opt %s -split-input-file -verify-diagnostics --etensor-verify-graph --etensor-dynamic-schedule | FileCheck %s --check-prefix=DYNAMIC

/// A recurrence over layers: `gather` feeds the next layer's `step` through a
/// shifted out-edge. The tasks form a cycle (step -> gather -> step), the
/// instances do not: a shifted edge is loop-carried and does not order the
/// tasks, so both schedules number them start, step, gather.
func.func private @start(%i: index, %x: memref<4xf32>)
func.func private @step(%l: index, %j: index, %x: memref<4xf32>)
func.func private @gather(%l: index, %x: memref<4xf32>)

// VERIFY-LABEL: etensor.graph @layers
// VERIFY: outs(%{{.*}}[(d0) -> (d0 + 1)]
// STATIC-LABEL: etensor.graph @layers
// STATIC: etensor.dispatch 0 grid [1] attributes {name = "start"}
// STATIC: etensor.dispatch 1 grid [3, 4] attributes {name = "step"}
// STATIC: etensor.dispatch 2 grid [3] attributes {name = "gather"}
// STATIC: %[[ONE:.*]] = arith.constant 1 : index
// STATIC-NEXT: %[[NEXT:.*]] = arith.addi %{{.*}}, %[[ONE]] : index
// STATIC: etensor.notify %{{.*}}[%[[NEXT]]]
// DYNAMIC-LABEL: etensor.graph @layers
// DYNAMIC: etensor.dispatch 0 grid [1] attributes {etensor.ready_at_start, name = "start"}
/// `ready` has 4 coordinates, `step` 3 layers: completing a coordinate pushes
/// step instances only when it lies inside step's grid.
// DYNAMIC: %[[DONE:.*]] = etensor.notify
// DYNAMIC-NEXT: scf.if %[[DONE]] {
// DYNAMIC-NEXT: %[[LAYERS:.*]] = arith.constant 3 : index
// DYNAMIC-NEXT: %[[INSIDE:.*]] = arith.cmpi ult, %{{.*}}, %[[LAYERS]] : index
// DYNAMIC-NEXT: scf.if %[[INSIDE]] {
// DYNAMIC: etensor.push
// DYNAMIC: etensor.dispatch 1 grid [3, 4] attributes {name = "step"}
// DYNAMIC: etensor.dispatch 2 grid [3] attributes {name = "gather"}
etensor.graph @layers(%x: memref<4xf32>) {
  %ready = etensor.event() count 1 {name = "ready"} : !etensor.event<4>
  %stepped = etensor.event() count 4 {name = "stepped"} : !etensor.event<3>
  etensor.task @start grid [1] args(%x : memref<4xf32>) outs(%ready[(i) -> (0)] : !etensor.event<4>) {name = "start"}
  etensor.task @step grid [3, 4] args(%x : memref<4xf32>) ins(%ready[(l, j) -> (l)] : !etensor.event<4>) outs(%stepped[(l, j) -> (l)] : !etensor.event<3>) {name = "step"}
  etensor.task @gather grid [3] args(%x : memref<4xf32>) ins(%stepped[(l) -> (l)] : !etensor.event<3>) outs(%ready[(l) -> (l + 1)] : !etensor.event<4>) {name = "gather"}
}

// -----

/// Without the shift the same edges are a real cycle.
func.func private @step(%l: index, %j: index, %x: memref<4xf32>)
func.func private @gather(%l: index, %x: memref<4xf32>)

etensor.graph @cycle(%x: memref<4xf32>) {
  %ready = etensor.event() count 1 {name = "ready"} : !etensor.event<4>
  %stepped = etensor.event() count 4 {name = "stepped"} : !etensor.event<3>
  // expected-error @+1 {{is part of a dependency cycle}}
  etensor.task @step grid [3, 4] args(%x : memref<4xf32>) ins(%ready[(l, j) -> (l)] : !etensor.event<4>) outs(%stepped[(l, j) -> (l)] : !etensor.event<3>) {name = "step"}
  // expected-note @+1 {{task 'gather' in the cycle}}
  etensor.task @gather grid [3] args(%x : memref<4xf32>) ins(%stepped[(l) -> (l)] : !etensor.event<3>) outs(%ready[(l) -> (l)] : !etensor.event<4>) {name = "gather"}
}
