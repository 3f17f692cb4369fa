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

// -----

/// Graph symbols at positions past the grid rank (found by fuzzing: the
/// extents were simplified with one symbol per grid dimension and the
/// affine flattener asserted).
func.func private @tile(%i: index)
// CHECK-LABEL: etensor.graph @symbol_past_grid_rank
etensor.graph @symbol_past_grid_rank(%pad: index, %n: index) {
  %t = arith.addi %n, %pad : index
  %m = arith.subi %t, %pad : index
  %e = etensor.event(%n) count 1 : !etensor.event<?>
  etensor.task @tile grid [%m] outs(%e[(i) -> (i)] : !etensor.event<?>)
  etensor.task @tile grid [%n] ins(%e[(i) -> (i)] : !etensor.event<?>)
}

// -----

/// A fan-in over symbol 64 (the fan-in was simplified with 64 symbols).
func.func private @tile2(%i: index, %j: index)
func.func private @tile(%i: index)
// CHECK-LABEL: etensor.graph @sixty_five_symbols
etensor.graph @sixty_five_symbols(
    %a0: index, %a1: index, %a2: index, %a3: index, %a4: index, %a5: index, %a6: index, %a7: index,
    %a8: index, %a9: index, %a10: index, %a11: index, %a12: index, %a13: index, %a14: index, %a15: index,
    %a16: index, %a17: index, %a18: index, %a19: index, %a20: index, %a21: index, %a22: index, %a23: index,
    %a24: index, %a25: index, %a26: index, %a27: index, %a28: index, %a29: index, %a30: index, %a31: index,
    %a32: index, %a33: index, %a34: index, %a35: index, %a36: index, %a37: index, %a38: index, %a39: index,
    %a40: index, %a41: index, %a42: index, %a43: index, %a44: index, %a45: index, %a46: index, %a47: index,
    %a48: index, %a49: index, %a50: index, %a51: index, %a52: index, %a53: index, %a54: index, %a55: index,
    %a56: index, %a57: index, %a58: index, %a59: index, %a60: index, %a61: index, %a62: index, %a63: index,
    %a64: index) {
  %e = etensor.event(%a0) count %a64 : !etensor.event<?>
  etensor.task @tile2 grid [%a0, %a64] outs(%e[(i, j) -> (i)] : !etensor.event<?>)
  etensor.task @tile grid [%a0] ins(%e[(i) -> (i)] : !etensor.event<?>)
}

// -----

/// Static extents whose product overflows int64: the enumeration of the
/// fan-in gives up instead of indexing past its counters.
func.func private @tile(%i: index)
etensor.graph @huge_static_event() {
  // expected-warning @+1 {{the fan-in of event 'e' cannot be computed at compile time}}
  %e = etensor.event() count 1 {name = "e"} : !etensor.event<4294967296x4294967296>
  etensor.task @tile grid [4] outs(%e[(i) -> (i, i)] : !etensor.event<4294967296x4294967296>)
  etensor.task @tile grid [4] ins(%e[(i) -> (i, i)] : !etensor.event<4294967296x4294967296>)
}

// -----

func.func private @gather(%e: index)
func.func private @expert(%i: index, %c: index)

/// A triggered task runs a data-dependent number of instances: the events it
/// notifies need table wait counts.
etensor.graph @triggered_fan_in(%experts: index, %tiles: index, %indptr: memref<?xi32>) {
  %ready = etensor.event(%experts) count 1 : !etensor.event<?>
  // expected-error @+1 {{event 'done' is notified by a task with a data-dependent trigger, which runs a data-dependent number of instances: its wait count must be a table}}
  %done = etensor.event(%experts) count 4 {name = "done"} : !etensor.event<?>
  etensor.task @gather grid [%experts] outs(%ready[(e) -> (e)] : !etensor.event<?>)
  // expected-note @+1 {{notified by task 'expert'}}
  etensor.task @expert grid [%tiles] outs(%done[(i, c) -> (c)] : !etensor.event<?>) triggered_by(%ready, %indptr : !etensor.event<?>, memref<?xi32>)
  etensor.task @gather grid [%experts] ins(%done[(e) -> (e)] : !etensor.event<?>)
}

// -----

/// Every rank notifies a ranked event, so its wait count (here %ranks, or 3
/// on a static event whose producer picks the peer from its rank) is checked
/// when the ranks launch, not against this rank's fan-in.
func.func private @gemm(%r: index, %i: index, %rank: index)
func.func private @tile(%i: index)
// CHECK-LABEL: etensor.graph @ranked_fan_in
// CHECK: etensor.event(%{{.*}}, %{{.*}}) count %{{.*}} ranked {name = "rs"} : !etensor.event<?x?>
// CHECK: etensor.task @gemm
etensor.graph @ranked_fan_in(%ranks: index, %rank: index, %tiles: index) {
  %rs = etensor.event(%ranks, %tiles) count %ranks ranked {name = "rs"} : !etensor.event<?x?>
  %st = etensor.event() count 3 ranked {name = "st"} : !etensor.event<4x8>
  etensor.task @gemm grid [%ranks, %tiles] rank(%rank) args(%rank : index) outs(%rs[(d, i) -> (d, i)] : !etensor.event<?x?>)
  etensor.task @tile grid [%tiles] rank(%rank) ins(%rs[(i)[r] -> (r, i)] : !etensor.event<?x?>)
  etensor.task @tile grid [8] rank(%rank) outs(%st[(i)[r] -> ((r + 1) mod 4, i)] : !etensor.event<4x8>)
  etensor.task @tile grid [8] rank(%rank) ins(%st[(i)[r] -> (r, i)] : !etensor.event<4x8>)
}

// -----

/// A local event whose producer maps onto it with the rank: its fan-in is
/// only known per rank.
func.func private @tile(%i: index)
etensor.graph @rank_in_out_map(%rank: index) {
  // expected-warning @+1 {{the fan-in of event 'e' depends on the rank (task 'mine' maps onto it with the rank symbol); its wait count is checked when the ranks launch}}
  %e = etensor.event() count 1 {name = "e"} : !etensor.event<4>
  etensor.task @tile grid [1] rank(%rank) outs(%e[(i)[r] -> (r)] : !etensor.event<4>) {name = "mine"}
  etensor.task @tile grid [4] ins(%e[(i) -> (i)] : !etensor.event<4>)
}
