// RUN: etc-opt %s -split-input-file -verify-diagnostics --etensor-verify-graph | FileCheck %s

/// A symbolic wait count equal to the fan-in is accepted, and the pass leaves
/// the graph unchanged.
func.func private @tile2(%i: index, %j: index)
func.func private @tile(%i: index)
// CHECK-LABEL: etensor.graph @symbolic_fan_in
// CHECK: etensor.task @tile2
etensor.graph @symbolic_fan_in(%n: index, %k: index) {
  %c2 = arith.constant 2 : index
  %count = arith.muli %k, %c2 : index
  %e = etensor.event(%n) count %count : !etensor.event<?>
  // Two producers: k and k more notifications per row.
  etensor.task @tile2 grid [%n, %k] outs(%e[(i, j) -> (i)] : !etensor.event<?>)
  etensor.task @tile2 grid [%n, %k] outs(%e[(i, j) -> (i)] : !etensor.event<?>)
  etensor.task @tile grid [%n] ins(%e[(i) -> (i)] : !etensor.event<?>)
}

// -----

/// Transposed 2-D maps and a consumer reading a projection.
func.func private @tile2(%i: index, %j: index)
func.func private @tile(%i: index)
// CHECK-LABEL: etensor.graph @transpose
etensor.graph @transpose(%n: index, %m: index) {
  %e = etensor.event(%m, %n) count 1 : !etensor.event<?x?>
  %f = etensor.event(%m) count %n : !etensor.event<?>
  etensor.task @tile2 grid [%n, %m] outs(%e[(i, j) -> (j, i)] : !etensor.event<?x?>)
  etensor.task @tile2 grid [%m, %n] ins(%e[(i, j) -> (i, j)] : !etensor.event<?x?>) outs(%f[(i, j) -> (i)] : !etensor.event<?>)
  etensor.task @tile grid [%m] ins(%f[(i) -> (i)] : !etensor.event<?>)
}

// -----

/// A rank-0 event: every producer instance notifies the single counter.
func.func private @tile(%i: index)
func.func private @tile0()
// CHECK-LABEL: etensor.graph @barrier
etensor.graph @barrier(%n: index) {
  %all = etensor.event() count %n : !etensor.event<>
  etensor.task @tile grid [%n] outs(%all[(i) -> ()] : !etensor.event<>)
  etensor.task @tile0 grid [] ins(%all[() -> ()] : !etensor.event<>)
}

// -----

/// Non-uniform maps over static extents are counted point by point.
func.func private @tile(%i: index)
// CHECK-LABEL: etensor.graph @pairs
etensor.graph @pairs() {
  %e = etensor.event() count 2 : !etensor.event<4>
  etensor.task @tile grid [8] outs(%e[(i) -> (i floordiv 2)] : !etensor.event<4>)
  etensor.task @tile grid [4] ins(%e[(i) -> (i)] : !etensor.event<4>)
}

// -----

/// Data-dependent wait counts are checked at run time, not here.
func.func private @tile(%i: index)
// CHECK-LABEL: etensor.graph @table_count
etensor.graph @table_count(%n: index, %counts: memref<?xi32>) {
  %e = etensor.event(%n) count from %counts : memref<?xi32> : !etensor.event<?>
  etensor.task @tile grid [%n] outs(%e[(i) -> (i)] : !etensor.event<?>)
  etensor.task @tile grid [%n] ins(%e[(i) -> (i)] : !etensor.event<?>)
}

// -----

/// Symbolic extents with a non-uniform map: cannot be proven here.
func.func private @tile(%i: index)
etensor.graph @unknown_fan_in(%n: index) {
  // expected-warning @+1 {{the fan-in of event 'e' cannot be computed at compile time}}
  %e = etensor.event(%n) count 2 {name = "e"} : !etensor.event<?>
  etensor.task @tile grid [%n] outs(%e[(i) -> (i floordiv 2)] : !etensor.event<?>)
  etensor.task @tile grid [%n] ins(%e[(i) -> (i)] : !etensor.event<?>)
}

// -----

/// Products of symbols: `n*n + n` and the fan-in `n*(n+1)` are the same
/// polynomial even though the affine simplifier spells them differently.
func.func private @tile3(%i: index, %j: index, %k: index)
func.func private @tile(%i: index)
// CHECK-LABEL: etensor.graph @polynomial_count
etensor.graph @polynomial_count(%n: index) {
  %c1 = arith.constant 1 : index
  %sq = arith.muli %n, %n : index
  %count = arith.addi %sq, %n : index
  %np1 = arith.addi %n, %c1 : index
  %e = etensor.event(%n) count %count : !etensor.event<?>
  etensor.task @tile3 grid [%n, %n, %np1] outs(%e[(i, j, k) -> (i)] : !etensor.event<?>)
  etensor.task @tile grid [%n] ins(%e[(i) -> (i)] : !etensor.event<?>)
}
