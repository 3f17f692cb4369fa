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

func.func private @plan(%i: index)
func.func private @gather(%e: index)
func.func private @expert(%i: index, %c: index)

/// A data-dependent trigger: the dispatch keeps it (the lowering waits for
/// the whole event and finds `c`) and its `guarded_indptr`; the in-edge wait
/// comes first and the out-edge notifies the coordinate `c`.
// CHECK-LABEL: etensor.graph @moe
// CHECK: etensor.dispatch 2 grid [%{{.*}}] triggered_by(%[[R:.*]], %{{.*}} : !etensor.event<?>, memref<?xi32>) attributes {guarded_indptr, name = "expert"} {
// CHECK-NEXT: ^bb0(%[[I:.*]]: index, %[[C:.*]]: index):
// CHECK: etensor.wait %{{.*}}[%{{.*}}] : !etensor.event<1>
// CHECK-NEXT: func.call @expert(%[[I]], %[[C]])
// CHECK-NEXT: etensor.notify %{{.*}}[%[[C]]] : !etensor.event<?>
etensor.graph @moe(%experts: index, %tiles: index, %indptr: memref<?xi32>, %counts: memref<?xi32>) {
  %planned = etensor.event() count 1 {name = "planned"} : !etensor.event<1>
  %ready = etensor.event(%experts) count 1 {name = "ready"} : !etensor.event<?>
  %done = etensor.event(%experts) count from %counts : memref<?xi32> {name = "done"} : !etensor.event<?>
  etensor.task @plan grid [1] outs(%planned[(i) -> (0)] : !etensor.event<1>)
  etensor.task @gather grid [%experts] ins(%planned[(e) -> (0)] : !etensor.event<1>) outs(%ready[(e) -> (e)] : !etensor.event<?>, %done[(e) -> (e)] : !etensor.event<?>)
  etensor.task @expert grid [%tiles] ins(%planned[(i, c) -> (0)] : !etensor.event<1>) outs(%done[(i, c) -> (c)] : !etensor.event<?>) triggered_by(%ready, %indptr : !etensor.event<?>, memref<?xi32>) {guarded_indptr}
  etensor.task @gather grid [%experts] ins(%done[(e) -> (e)] : !etensor.event<?>)
}

// -----

func.func private @gemm(%r: index, %i: index, %rank: index, %p: memref<?xi64>)
func.func private @reduce(%i: index, %rank: index, %out: memref<?xf32>)
func.func private @tile(%i: index)

/// Ranked events: the maps' symbol is the task's rank, substituted into the
/// coordinates. A producer notifies the coordinate of the rank it writes to
/// (dimension 0); a consumer waits on its own rank's copy; an expression of
/// the rank is expanded like one of the grid coordinates.
// CHECK-LABEL: etensor.graph @reduce_scatter
// CHECK-SAME: (%[[RANKS:.*]]: index, %[[RANK:.*]]: index, %[[T:.*]]: index, %[[P:.*]]: memref<?xi64>, %[[OUT:.*]]: memref<?xf32>)
// CHECK: %[[RS:.*]] = etensor.event(%[[RANKS]], %[[T]]) count %[[RANKS]] ranked {name = "rs"} : !etensor.event<?x?>
// CHECK: %[[RING:.*]] = etensor.event(%[[T]]) count 1 ranked {name = "ring"} : !etensor.event<8x?>
// CHECK: etensor.dispatch 0 grid [%[[RANKS]], %[[T]]] attributes {name = "gemm"} {
// CHECK-NEXT: ^bb0(%[[D:.*]]: index, %[[I:.*]]: index):
// CHECK-NEXT: func.call @gemm(%[[D]], %[[I]], %[[RANK]], %[[P]])
// CHECK-NEXT: etensor.notify %[[RS]][%[[D]], %[[I]]] : !etensor.event<?x?>
// CHECK-NEXT: }
// CHECK-NEXT: etensor.dispatch 1 grid [%[[T]]] attributes {name = "reduce"} {
// CHECK-NEXT: ^bb0(%[[K:.*]]: index):
// CHECK-NEXT: etensor.wait %[[RS]][%[[RANK]], %[[K]]] : !etensor.event<?x?>
// CHECK-NEXT: func.call @reduce(%[[K]], %[[RANK]], %[[OUT]])
// CHECK: %[[NEXT:.*]] = arith.addi %[[RANK]], %{{.*}} : index
// CHECK: %[[MOD:.*]] = arith.remsi %[[NEXT]], %{{.*}} : index
// CHECK: %[[PEER:.*]] = arith.select %{{.*}}, %{{.*}}, %[[MOD]] : index
// CHECK-NEXT: etensor.notify %[[RING]][%[[PEER]], %[[K]]] : !etensor.event<8x?>
// CHECK: etensor.dispatch 2 grid [%[[T]]] attributes {name = "tile"} {
// CHECK-NEXT: ^bb0(%[[L:.*]]: index):
// CHECK-NEXT: etensor.wait %[[RING]][%[[RANK]], %[[L]]] : !etensor.event<8x?>
// CHECK-NEXT: func.call @tile(%[[L]])
etensor.graph @reduce_scatter(%ranks: index, %rank: index, %tiles: index, %p: memref<?xi64>, %out: memref<?xf32>) {
  %rs = etensor.event(%ranks, %tiles) count %ranks ranked {name = "rs"} : !etensor.event<?x?>
  %ring = etensor.event(%tiles) count 1 ranked {name = "ring"} : !etensor.event<8x?>
  etensor.task @reduce grid [%tiles] rank(%rank) args(%rank, %out : index, memref<?xf32>) ins(%rs[(i)[r] -> (r, i)] : !etensor.event<?x?>) outs(%ring[(i)[r] -> ((r + 1) mod 8, i)] : !etensor.event<8x?>)
  etensor.task @gemm grid [%ranks, %tiles] rank(%rank) args(%rank, %p : index, memref<?xi64>) outs(%rs[(d, i) -> (d, i)] : !etensor.event<?x?>)
  etensor.task @tile grid [%tiles] rank(%rank) ins(%ring[(i)[r] -> (r, i)] : !etensor.event<8x?>)
}

// -----

func.func private @tile(%i: index)

// expected-error @+1 {{has a dependency cycle; run etensor-verify-graph for details}}
etensor.graph @cycle_rejected(%n: index) {
  %e = etensor.event(%n) count 1 : !etensor.event<?>
  etensor.task @tile grid [%n] ins(%e[(i) -> (i)] : !etensor.event<?>) outs(%e[(i) -> (i)] : !etensor.event<?>)
}

// -----

/// A tensor more static than the tile's parameter is cast at the call: one
/// generic tile serves static tensors.
func.func private @generic(%i: index, %a: memref<?x4xf32>)

// CHECK-LABEL: etensor.graph @cast_to_callee
// CHECK-SAME: (%[[A:.*]]: memref<8x4xf32>)
// CHECK: ^bb0(%[[I:.*]]: index):
// CHECK-NEXT: %[[CAST:.*]] = memref.cast %[[A]] : memref<8x4xf32> to memref<?x4xf32>
// CHECK-NEXT: func.call @generic(%[[I]], %[[CAST]])
etensor.graph @cast_to_callee(%a: memref<8x4xf32>) {
  etensor.task @generic grid [8] args(%a : memref<8x4xf32>)
}

// -----

/// A task's prefetch function is called before its waits, with the tile's
/// arguments; the kernel runs it on every thread.
func.func private @tile(%i: index, %w: memref<?xf32>)
func.func private @tile__prefetch(%i: index, %w: memref<?xf32>)

// CHECK-LABEL: etensor.graph @prefetched
// CHECK: etensor.dispatch 1
// CHECK-NEXT: ^bb0(%[[I:.*]]: index):
// CHECK-NEXT: func.call @tile__prefetch(%[[I]], %{{.*}}) {etensor.prefetch}
// CHECK: etensor.wait
// CHECK-NEXT: func.call @tile(%[[I]], %{{.*}})
etensor.graph @prefetched(%n: index, %w: memref<?xf32>) {
  %e = etensor.event() count 1 : !etensor.event<1>
  etensor.task @tile grid [1] args(%w : memref<?xf32>) outs(%e[(i) -> (0)] : !etensor.event<1>)
  etensor.task @tile grid [%n] args(%w : memref<?xf32>) ins(%e[(i) -> (0)] : !etensor.event<1>) {prefetch = @tile__prefetch}
}

// -----

/// With `prefetch_after = 1` the prefetch follows the first wait (it may
/// read what that wait's producer wrote) and precedes the second.
func.func private @tile(%i: index, %w: memref<?xf32>)
func.func private @tile__prefetch(%i: index, %w: memref<?xf32>)

// CHECK-LABEL: etensor.graph @prefetched_after
// CHECK: etensor.dispatch 2
// CHECK-NEXT: ^bb0(%[[I:.*]]: index):
// CHECK-NOT: func.call
// CHECK: etensor.wait
// CHECK-NEXT: func.call @tile__prefetch(%[[I]], %{{.*}}) {etensor.prefetch}
// CHECK-NEXT: arith.constant
// CHECK-NEXT: etensor.wait
// CHECK-NEXT: func.call @tile(%[[I]], %{{.*}})
etensor.graph @prefetched_after(%n: index, %w: memref<?xf32>) {
  %table = etensor.event() count 1 : !etensor.event<1>
  %rows = etensor.event() count 1 : !etensor.event<1>
  etensor.task @tile grid [1] args(%w : memref<?xf32>) outs(%table[(i) -> (0)] : !etensor.event<1>)
  etensor.task @tile grid [1] args(%w : memref<?xf32>) outs(%rows[(i) -> (0)] : !etensor.event<1>)
  etensor.task @tile grid [%n] args(%w : memref<?xf32>) ins(%table[(i) -> (0)] : !etensor.event<1>, %rows[(i) -> (0)] : !etensor.event<1>) {prefetch = @tile__prefetch, prefetch_after = 1}
}

// -----

/// A `ticketed` task: the schedule declares its ticket counter, an event no
/// one waits on or notifies, and hands it to the dispatch.
// CHECK-LABEL: etensor.graph @balanced
// CHECK: %[[TICKET:.*]] = etensor.event() count 1 {name = "ticket.tile"} : !etensor.event<1>
// CHECK: etensor.dispatch 0 grid [%{{.*}}] ticket(%[[TICKET]] : !etensor.event<1>) attributes {name = "tile"}
func.func private @tile(%i: index)
func.func private @sink(%i: index)
etensor.graph @balanced(%n: index) {
  %done = etensor.event() count %n {name = "done"} : !etensor.event<1>
  etensor.task @tile grid [%n] outs(%done[(i) -> (0)] : !etensor.event<1>) {ticketed}
  etensor.task @sink grid [1] ins(%done[(i) -> (0)] : !etensor.event<1>)
}

// -----

/// A `pooled` task: the schedule declares a counter per pool, over the grid
/// dimension `pool_dim` names (here the dynamic layer count), and hands the
/// event and the dimension to the dispatch.
// CHECK-LABEL: etensor.graph @pooled
// CHECK: %[[POOLS:.*]] = etensor.event(%arg0) count 1 {name = "pool.head"} : !etensor.event<?>
// CHECK: %[[ONE:.*]] = etensor.event() count 1 {name = "pool.tail"} : !etensor.event<1>
// CHECK: etensor.dispatch 0 grid [%arg0, 64] pool(%[[POOLS]] : !etensor.event<?>) attributes {name = "head", pool_dim = 0 : i64}
// CHECK: etensor.dispatch 1 grid [8] pool(%[[ONE]] : !etensor.event<1>) attributes {name = "tail"}
func.func private @head(%l: index, %j: index)
func.func private @tail(%i: index)
etensor.graph @pooled(%layers: index) {
  %done = etensor.event() count 1 {name = "done"} : !etensor.event<1>
  etensor.task @head grid [%layers, 64] outs(%done[(l, j) -> (0)] : !etensor.event<1>) {pooled, pool_dim = 0 : i64}
  etensor.task @tail grid [8] ins(%done[(i) -> (0)] : !etensor.event<1>) {pooled}
}
