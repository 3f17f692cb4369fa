// RUN: etc-opt %s -split-input-file -verify-diagnostics --etensor-dynamic-schedule | FileCheck %s
// RUN: etc-opt %s -split-input-file -verify-diagnostics --etensor-dynamic-schedule="early-push=false" | FileCheck %s --check-prefix=LATE

func.func private @top(%i: index, %j: index)
func.func private @side(%i: index)
func.func private @bottom(%i: index, %j: index)

/// A diamond whose sink waits on two events. Early push: every producer
/// counts its dispatch on `dispatched.<event>` and pushes the consumers it
/// completes; consumers wait for completion; `bottom`, with two in-edges,
/// is pushed through its `ready.bottom` counter.
// CHECK-LABEL: etensor.graph @diamond
// CHECK-SAME: (%[[N:.*]]: index)
// CHECK: %[[E:.*]] = etensor.event(%[[N]]) count 4 {name = "e"}
// CHECK: %[[F:.*]] = etensor.event(%[[N]]) count 1 {name = "f"}
// CHECK: %[[G:.*]] = etensor.event(%[[N]]) count 1 {name = "g"}
// CHECK: %[[READY:.*]] = etensor.event(%[[N]]) count 2 {name = "ready.bottom"} : !etensor.event<?x2>
// CHECK: %[[DE:.*]] = etensor.event(%[[N]]) count 4 {name = "dispatched.e"}
// CHECK: %[[DF:.*]] = etensor.event(%[[N]]) count 1 {name = "dispatched.f"}
// CHECK: %[[DG:.*]] = etensor.event(%[[N]]) count 1 {name = "dispatched.g"}
// CHECK: %[[Q:.*]] = etensor.queue capacity %{{.*}} : !etensor.queue
// CHECK: etensor.worker dynamic(%[[Q]] : !etensor.queue) {
// CHECK: etensor.dispatch 0 grid [%[[N]], 4] attributes {etensor.ready_at_start, name = "top"}
// CHECK-NEXT: ^bb0(%[[I:.*]]: index, %{{.*}}: index):
// CHECK-NEXT: %[[D:.*]] = etensor.notify %[[DE]][%[[I]]] : !etensor.event<?> -> i1
// CHECK-NEXT: scf.if %[[D]] {
// CHECK: etensor.push %[[Q]][1, %{{.*}}] : !etensor.queue
// CHECK: etensor.push %[[Q]][2, %{{.*}}] : !etensor.queue
// CHECK: func.call @top
// CHECK-NEXT: etensor.notify %[[E]][%[[I]]] : !etensor.event<?>
// CHECK: etensor.dispatch 1 grid [%[[N]]] attributes {name = "left"}
// CHECK: scf.for %[[J:.*]] = %{{.*}} to %{{.*}} step
// CHECK: %[[R:.*]] = etensor.notify %[[READY]][%{{.*}}, %[[J]]] : !etensor.event<?x2> -> i1
// CHECK-NEXT: scf.if %[[R]] {
// CHECK-NEXT: etensor.push %[[Q]][3, %{{.*}}] : !etensor.queue
// CHECK: etensor.wait %[[E]][%{{.*}}] : !etensor.event<?>
// CHECK-NEXT: func.call @side
// CHECK: etensor.dispatch 3 grid [%[[N]], 2] attributes {name = "bottom"}
// CHECK: etensor.wait %[[F]]
// CHECK-NEXT: etensor.wait %[[G]]
// CHECK-NEXT: func.call @bottom

/// Without early push: no dispatch counters, no waits; the notification
/// that completes an event pushes its consumers.
// LATE-LABEL: etensor.graph @diamond
// LATE-NOT: dispatched
// LATE: etensor.dispatch 0
// LATE: func.call @top
// LATE-NEXT: %[[D:.*]] = etensor.notify %{{.*}}[%{{.*}}] : !etensor.event<?> -> i1
// LATE-NEXT: scf.if %[[D]] {
// LATE: etensor.push
// LATE-NOT: etensor.wait
// LATE: etensor.dispatch 3
etensor.graph @diamond(%n: index) {
  %e = etensor.event(%n) count 4 {name = "e"} : !etensor.event<?>
  %f = etensor.event(%n) count 1 {name = "f"} : !etensor.event<?>
  %g = etensor.event(%n) count 1 {name = "g"} : !etensor.event<?>
  etensor.task @top grid [%n, 4] outs(%e[(i, j) -> (i)] : !etensor.event<?>) {name = "top"}
  etensor.task @side grid [%n] ins(%e[(i) -> (i)] : !etensor.event<?>) outs(%f[(i) -> (i)] : !etensor.event<?>) {name = "left"}
  etensor.task @side grid [%n] ins(%e[(i) -> (i)] : !etensor.event<?>) outs(%g[(i) -> (i)] : !etensor.event<?>) {name = "right"}
  etensor.task @bottom grid [%n, 2] ins(%f[(i, j) -> (i)] : !etensor.event<?>, %g[(i, j) -> (i)] : !etensor.event<?>) {name = "bottom"}
}

// -----

func.func private @tile(%i: index)

/// A constant in an in-map: only that coordinate has consumers, every
/// instance of the consumer's grid: one range push of all %n of them.
// CHECK-LABEL: etensor.graph @broadcast
// CHECK-SAME: (%[[N:.*]]: index)
// CHECK: etensor.dispatch 0
// CHECK: %[[EQ:.*]] = arith.cmpi eq, %{{.*}}, %{{.*}} : index
// CHECK-NEXT: scf.if %[[EQ]] {
// CHECK-NOT: scf.for
// CHECK: etensor.push %{{.*}}[1, %{{.*}}] count %[[N]]
etensor.graph @broadcast(%n: index) {
  %e = etensor.event() count 1 : !etensor.event<4>
  etensor.task @tile grid [4] outs(%e[(i) -> (i)] : !etensor.event<4>)
  etensor.task @tile grid [%n] ins(%e[(i) -> (2)] : !etensor.event<4>)
}

// -----

func.func private @tile(%i: index)

/// Several in-edges that all map to a constant coordinate (the MoE combine's
/// `planned` and `down_done`): every instance is ready at once, so the
/// `ready.<task>` counter has one coordinate and the in-edge that completes
/// it pushes the whole grid as one range, not one atomic per instance.
// CHECK-LABEL: etensor.graph @join
// CHECK-SAME: (%[[N:.*]]: index)
// CHECK: %[[READY:.*]] = etensor.event() count 2 {name = "ready.join"} : !etensor.event<1>
// CHECK: etensor.dispatch 0
// CHECK: %[[D:.*]] = etensor.notify %[[READY]][%{{.*}}] : !etensor.event<1> -> i1
// CHECK-NEXT: scf.if %[[D]] {
// CHECK-NEXT: etensor.push %{{.*}}[2, %{{.*}}] count %[[N]]
// CHECK: etensor.dispatch 1
// CHECK-NOT: scf.for
// CHECK: etensor.notify %[[READY]]
// CHECK: etensor.dispatch 2 grid [%[[N]]] attributes {name = "join"}
etensor.graph @join(%n: index) {
  %a = etensor.event() count 1 : !etensor.event<1>
  %b = etensor.event() count 1 : !etensor.event<1>
  etensor.task @tile grid [1] outs(%a[(i) -> (0)] : !etensor.event<1>)
  etensor.task @tile grid [1] ins(%a[(i) -> (0)] : !etensor.event<1>) outs(%b[(i) -> (0)] : !etensor.event<1>)
  etensor.task @tile grid [%n] ins(%a[(i) -> (0)] : !etensor.event<1>, %b[(i) -> (0)] : !etensor.event<1>) {name = "join"}
}

// -----

func.func private @tile(%i: index)

/// A one-coordinate in-edge next to a per-instance one (the MoE top-k once
/// waited on `cleared` and `scored[i]`): every instance gets a ready counter
/// and `cleared`'s completion updates them one by one. Correct, but slow:
/// the pass says so.
// CHECK-LABEL: etensor.graph @mixed
// CHECK: etensor.event(%{{.*}}) count 2 {name = "ready.mixed"}
etensor.graph @mixed(%n: index) {
  %cleared = etensor.event() count 1 {name = "cleared"} : !etensor.event<1>
  %scored = etensor.event(%n) count 1 {name = "scored"} : !etensor.event<?>
  etensor.task @tile grid [1] outs(%cleared[(i) -> (0)] : !etensor.event<1>)
  etensor.task @tile grid [%n] outs(%scored[(i) -> (i)] : !etensor.event<?>)
  // expected-warning @+1 {{task 'mixed' waits on one coordinate of event 'cleared' from every instance, next to per-instance in-edges}}
  etensor.task @tile grid [%n] ins(%cleared[(i) -> (0)] : !etensor.event<1>, %scored[(i) -> (i)] : !etensor.event<?>) {name = "mixed"}
}

// -----

func.func private @tile3(%i: index, %j: index, %k: index)
func.func private @tile(%i: index)

/// Dropped dimensions before a kept one are looped over; the dropped
/// innermost ones form a range: (i, j, k) waiting on e[j] pushes, for each
/// i, the range of all k.
// CHECK-LABEL: etensor.graph @ranges
// CHECK: scf.for %[[I:.*]] = %{{.*}} to %{{.*}} step
// CHECK: etensor.push %{{.*}}[1, %{{.*}}] count %{{.*}}
etensor.graph @ranges(%n: index) {
  %e = etensor.event() count 1 : !etensor.event<4>
  etensor.task @tile grid [4] outs(%e[(i) -> (i)] : !etensor.event<4>)
  etensor.task @tile3 grid [%n, 4, 8] ins(%e[(i, j, k) -> (j)] : !etensor.event<4>)
}

// -----

func.func private @tile(%i: index)

etensor.graph @not_a_projection(%n: index) {
  %e = etensor.event(%n) count 2 : !etensor.event<?>
  etensor.task @tile grid [%n] outs(%e[(i) -> (i floordiv 2)] : !etensor.event<?>)
  // expected-error @+1 {{in map #0 affine_map<(d0) -> (d0 * 2)> is not a projection}}
  etensor.task @tile grid [%n] ins(%e[(i) -> (i * 2)] : !etensor.event<?>)
}

// -----

func.func private @plan(%i: index)
func.func private @gather(%e: index)
func.func private @expert(%i: index, %c: index)

/// The notification that completes `ready[c]` pushes the instances
/// `[indptr[c], indptr[c+1])`; the last coordinate to fire (counted on
/// `fired.expert`) retires the bound's unused instances. Each range is
/// checked against the grid before its push (a bad one pushes nothing), and
/// the retired count is never negative. With early push the
/// trigger still fires on completion. The triggered task waits for its
/// other in-edge after the pop.
// CHECK-LABEL: etensor.graph @moe
// CHECK: %[[FIRED:.*]] = etensor.event(){{.*}}count %{{.*}} {name = "fired.expert"} : !etensor.event<1>
// CHECK: %[[Q:.*]] = etensor.queue
// CHECK: etensor.dispatch 1 grid [%{{.*}}] attributes {name = "gather"}
// CHECK: %[[DONE:.*]] = etensor.notify %{{.*}}[%{{.*}}] : !etensor.event<?> -> i1
// CHECK-NEXT: scf.if %[[DONE]] {
// CHECK: %[[LO:.*]] = arith.index_cast
// CHECK: %[[HI:.*]] = arith.index_cast
// CHECK: %[[OK:.*]] = etensor.check_range %[[LO]], %[[HI]] of task 2 at %[[E:.*]] bound %[[BOUND:[^ ]*]]
// CHECK: %[[N:.*]] = arith.subi %[[HI]], %[[LO]]
// CHECK: %[[COUNT:.*]] = arith.select %[[OK]], %[[N]], %{{.*}} : index
// CHECK: etensor.push %[[Q]][2, %[[LO]]] count %[[COUNT]] : !etensor.queue
// CHECK: %[[LAST:.*]] = etensor.notify %[[FIRED]][%{{.*}}] : !etensor.event<1> -> i1
// CHECK-NEXT: scf.if %[[LAST]] {
// CHECK: %[[USED:.*]] = arith.index_cast
// CHECK: %[[LEFT:.*]] = arith.subi %[[BOUND]], %[[USED]]
// CHECK: %[[UNUSED:.*]] = arith.maxsi %[[LEFT]], %{{.*}} : index
// CHECK: etensor.retire %[[Q]] count %[[UNUSED]] : !etensor.queue
// CHECK: etensor.dispatch 2 grid [%{{.*}}] triggered_by(%{{.*}}, %{{.*}} : !etensor.event<?>, memref<?xi32>) attributes {name = "expert"}
// CHECK-NEXT: ^bb0(%{{.*}}: index, %[[C:.*]]: index):
// CHECK: etensor.wait %{{.*}}[%{{.*}}] : !etensor.event<1>
// CHECK: func.call @expert
// LATE-LABEL: etensor.graph @moe
// LATE: etensor.push %{{.*}}[2, %{{.*}}] count
// LATE: etensor.retire
// LATE: etensor.dispatch 2
// LATE: etensor.wait %{{.*}}[%{{.*}}] : !etensor.event<1>
etensor.graph @moe(%experts: index, %tiles: index, %indptr: memref<?xi32>, %counts: memref<?xi32>) {
  %planned = etensor.event() count 1 {name = "planned"} : !etensor.event<1>
  %ready = etensor.event(%experts) count 1 {name = "ready"} : !etensor.event<?>
  %done = etensor.event(%experts) count from %counts : memref<?xi32> {name = "done"} : !etensor.event<?>
  etensor.task @plan grid [1] outs(%planned[(i) -> (0)] : !etensor.event<1>)
  etensor.task @gather grid [%experts] ins(%planned[(e) -> (0)] : !etensor.event<1>) outs(%ready[(e) -> (e)] : !etensor.event<?>, %done[(e) -> (e)] : !etensor.event<?>)
  etensor.task @expert grid [%tiles] ins(%planned[(i, c) -> (0)] : !etensor.event<1>) outs(%done[(i, c) -> (c)] : !etensor.event<?>) triggered_by(%ready, %indptr : !etensor.event<?>, memref<?xi32>)
  etensor.task @gather grid [%experts] ins(%done[(e) -> (e)] : !etensor.event<?>)
}

// -----

func.func private @gemm(%r: index, %i: index, %rank: index, %p: memref<?xi64>)
func.func private @prep(%i: index)
func.func private @reduce(%i: index, %rank: index, %out: memref<?xf32>)

/// A ranked event is notified from other ranks too, so it never pushes: its
/// notifications are plain (no `dispatched.rs`, no `-> i1`), its in-edges
/// count neither towards `ready.reduce` (2 local in-edges, not 3) nor
/// against `etensor.ready_at_start` (`only_ranked`), and its consumers wait
/// for it after the pop, on their own rank's copy.
// CHECK-LABEL: etensor.graph @reduce_scatter
// CHECK-SAME: (%[[RANKS:.*]]: index, %[[RANK:.*]]: index, %[[T:.*]]: index, %[[P:.*]]: memref<?xi64>, %[[OUT:.*]]: memref<?xf32>)
// CHECK: %[[RS:.*]] = etensor.event(%[[RANKS]], %[[T]]) count %[[RANKS]] ranked {name = "rs"} : !etensor.event<?x?>
// CHECK: %[[A:.*]] = etensor.event(%[[T]]) count 1 {name = "a"}
// CHECK: %[[B:.*]] = etensor.event(%[[T]]) count 1 {name = "b"}
// CHECK: %[[READY:.*]] = etensor.event(%[[T]]) count 2 {name = "ready.reduce"} : !etensor.event<?>
// CHECK-NOT: dispatched.rs
// CHECK: %[[Q:.*]] = etensor.queue capacity
// CHECK: etensor.dispatch 0 grid [%[[RANKS]], %[[T]]] attributes {etensor.ready_at_start, name = "gemm"} {
// CHECK-NEXT: ^bb0(%[[D:.*]]: index, %[[I:.*]]: index):
// CHECK-NEXT: func.call @gemm(%[[D]], %[[I]], %[[RANK]], %[[P]])
// CHECK-NEXT: etensor.notify %[[RS]][%[[D]], %[[I]]] : !etensor.event<?x?>{{$}}
// CHECK-NEXT: }
// CHECK: etensor.dispatch 1 grid [%[[T]]] attributes {etensor.ready_at_start, name = "prep"} {
// CHECK: etensor.notify %[[READY]][%{{.*}}] : !etensor.event<?> -> i1
// CHECK: etensor.push %[[Q]][2, %{{.*}}] : !etensor.queue
// CHECK: etensor.dispatch 2 grid [%[[T]]] attributes {name = "reduce"} {
// CHECK-NEXT: ^bb0(%[[K:.*]]: index):
// CHECK-NEXT: etensor.wait %[[RS]][%[[RANK]], %[[K]]] : !etensor.event<?x?>
// CHECK-NEXT: etensor.wait %[[A]][%[[K]]] : !etensor.event<?>
// CHECK-NEXT: etensor.wait %[[B]][%[[K]]] : !etensor.event<?>
// CHECK-NEXT: func.call @reduce(%[[K]], %[[RANK]], %[[OUT]])
// CHECK: etensor.dispatch 3 grid [%[[T]]] attributes {etensor.ready_at_start, name = "only_ranked"} {
// CHECK-NEXT: ^bb0(%[[L:.*]]: index):
// CHECK-NEXT: etensor.wait %[[RS]][%[[RANK]], %[[L]]] : !etensor.event<?x?>
// CHECK-NEXT: func.call @reduce(%[[L]], %[[RANK]], %[[OUT]])

/// Without early push the local in-edges are not waited on, the ranked one
/// still is.
// LATE-LABEL: etensor.graph @reduce_scatter
// LATE-SAME: (%{{[^:]*}}: index, %[[RANK:[^:]*]]: index,
// LATE: count 2 {name = "ready.reduce"}
// LATE-NOT: dispatched
// LATE: etensor.dispatch 0 grid [%{{.*}}, %{{.*}}] attributes {etensor.ready_at_start, name = "gemm"} {
// LATE-NEXT: ^bb0(%[[D:.*]]: index, %[[I:.*]]: index):
// LATE-NEXT: func.call @gemm
// LATE-NEXT: etensor.notify %{{.*}}[%[[D]], %[[I]]] : !etensor.event<?x?>{{$}}
// LATE-NEXT: }
// LATE: etensor.dispatch 2 grid [%{{.*}}] attributes {name = "reduce"} {
// LATE-NEXT: ^bb0(%[[K:.*]]: index):
// LATE-NEXT: etensor.wait %{{.*}}[%[[RANK]], %[[K]]] : !etensor.event<?x?>
// LATE-NEXT: func.call @reduce
// LATE: etensor.dispatch 3 grid [%{{.*}}] attributes {etensor.ready_at_start, name = "only_ranked"} {
// LATE-NEXT: ^bb0(%[[L:.*]]: index):
// LATE-NEXT: etensor.wait %{{.*}}[%[[RANK]], %[[L]]] : !etensor.event<?x?>
// LATE-NEXT: func.call @reduce
etensor.graph @reduce_scatter(%ranks: index, %rank: index, %tiles: index, %p: memref<?xi64>, %out: memref<?xf32>) {
  %rs = etensor.event(%ranks, %tiles) count %ranks ranked {name = "rs"} : !etensor.event<?x?>
  %a = etensor.event(%tiles) count 1 {name = "a"} : !etensor.event<?>
  %b = etensor.event(%tiles) count 1 {name = "b"} : !etensor.event<?>
  etensor.task @gemm grid [%ranks, %tiles] rank(%rank) args(%rank, %p : index, memref<?xi64>) outs(%rs[(d, i) -> (d, i)] : !etensor.event<?x?>)
  etensor.task @prep grid [%tiles] outs(%a[(i) -> (i)] : !etensor.event<?>, %b[(i) -> (i)] : !etensor.event<?>)
  etensor.task @reduce grid [%tiles] rank(%rank) args(%rank, %out : index, memref<?xf32>) ins(%rs[(i)[r] -> (r, i)] : !etensor.event<?x?>, %a[(i) -> (i)] : !etensor.event<?>, %b[(i) -> (i)] : !etensor.event<?>)
  etensor.task @reduce grid [%tiles] rank(%rank) args(%rank, %out : index, memref<?xf32>) ins(%rs[(i)[r] -> (r, i)] : !etensor.event<?x?>) {name = "only_ranked"}
}

// -----

func.func private @tile(%i: index)

/// The rank symbol in an in-map of a local event acts like a constant: only
/// the coordinate equal to the rank has consumers, every instance of the
/// consumer's grid, pushed when it completes.
// CHECK-LABEL: etensor.graph @rank_in_local_map
// CHECK-SAME: (%[[RANKS:.*]]: index, %[[RANK:.*]]: index, %[[N:.*]]: index)
// CHECK: etensor.dispatch 0 grid [%[[RANKS]]] attributes {etensor.ready_at_start, name = "tile"} {
// CHECK-NEXT: ^bb0(%[[D:.*]]: index):
// CHECK: %[[MINE:.*]] = arith.cmpi eq, %[[D]], %[[RANK]] : index
// CHECK-NEXT: scf.if %[[MINE]] {
// CHECK: etensor.push %{{.*}}[1, %{{.*}}] count %[[N]] : !etensor.queue
// CHECK: etensor.dispatch 1 grid [%[[N]]] attributes {name = "tile"} {
// CHECK-NEXT: ^bb0(%{{.*}}: index):
// CHECK-NEXT: etensor.wait %{{.*}}[%[[RANK]]] : !etensor.event<?>
// LATE-LABEL: etensor.graph @rank_in_local_map
// LATE-SAME: (%{{[^:]*}}: index, %[[RANK:[^:]*]]: index, %[[N:[^:]*]]: index)
// LATE: %[[MINE:.*]] = arith.cmpi eq, %{{.*}}, %[[RANK]] : index
// LATE-NEXT: scf.if %[[MINE]] {
// LATE: etensor.push %{{.*}}[1, %{{.*}}] count %[[N]] : !etensor.queue
// LATE-NOT: etensor.wait
// LATE: etensor.dispatch 1
etensor.graph @rank_in_local_map(%ranks: index, %rank: index, %n: index) {
  %e = etensor.event(%ranks) count 1 : !etensor.event<?>
  etensor.task @tile grid [%ranks] outs(%e[(d) -> (d)] : !etensor.event<?>)
  etensor.task @tile grid [%n] rank(%rank) ins(%e[(i)[r] -> (r)] : !etensor.event<?>)
}

// -----

func.func private @plan(%i: index)
func.func private @expert(%i: index, %c: index)

etensor.graph @trigger_in_edge_after(%experts: index, %tiles: index, %indptr: memref<?xi32>) {
  %ready = etensor.event(%experts) count 1 {name = "ready"} : !etensor.event<?>
  %late = etensor.event() count 1 {name = "late"} : !etensor.event<1>
  etensor.task @plan grid [%experts] outs(%ready[(e) -> (e)] : !etensor.event<?>)
  etensor.task @plan grid [1] outs(%late[(i) -> (0)] : !etensor.event<1>) {name = "unordered"}
  // expected-error @+1 {{waits on event 'late' besides its trigger 'ready', but its producer 'unordered' does not precede the trigger's producer 'plan': the dynamic schedule waits for such edges after the pop and could deadlock}}
  etensor.task @expert grid [%tiles] ins(%late[(i, c) -> (0)] : !etensor.event<1>) triggered_by(%ready, %indptr : !etensor.event<?>, memref<?xi32>)
}

// -----

func.func private @tile(%i: index)
func.func private @tile__prefetch(%i: index)

/// `prefetch_after = 1`: an early-pushed instance is popped once its
/// producers are dispatched, so its prefetch (which reads what the first
/// in-edge's producer wrote) follows that in-edge's wait, before the next.
/// Without early push the instance is popped after both producers ended:
/// no waits, and the prefetch just precedes the call.
// CHECK-LABEL: etensor.graph @prefetched_after
// CHECK: etensor.dispatch 2
// CHECK-NOT: func.call @tile__prefetch
// CHECK: etensor.wait
// CHECK-NEXT: func.call @tile__prefetch
// CHECK: etensor.wait
// CHECK-NEXT: func.call @tile(
// LATE-LABEL: etensor.graph @prefetched_after
// LATE: etensor.dispatch 2
// LATE-NOT: etensor.wait
// LATE: func.call @tile__prefetch
// LATE-NEXT: func.call @tile(
etensor.graph @prefetched_after(%n: index) {
  %a = etensor.event() count 1 : !etensor.event<1>
  %b = etensor.event() count 1 : !etensor.event<1>
  etensor.task @tile grid [1] outs(%a[(i) -> (0)] : !etensor.event<1>)
  etensor.task @tile grid [1] outs(%b[(i) -> (0)] : !etensor.event<1>)
  etensor.task @tile grid [%n] ins(%a[(i) -> (0)] : !etensor.event<1>, %b[(i) -> (0)] : !etensor.event<1>) {prefetch = @tile__prefetch, prefetch_after = 1}
}
