// RUN: etc-opt %s | etc-opt | FileCheck %s
// RUN: etc-opt %s --verify-roundtrip | FileCheck %s
// RUN: etc-opt %s -mlir-print-op-generic | etc-opt | FileCheck %s

func.func private @tile2d(%i: index, %j: index, %a: memref<?x256xf32>, %b: memref<?x4xf32>)
func.func private @tile1d(%i: index, %b: memref<?x4xf32>, %c: memref<?xf32>)
func.func private @expert(%t: index, %c: index, %x: memref<?x64xbf16>)
func.func private @scatter(%r: index, %i: index, %rank: index, %p: memref<?xi64>)
func.func private @reduce(%i: index, %rank: index, %out: memref<?xf32>)

// CHECK-LABEL: etensor.graph @event_types
// CHECK-SAME: (%[[N:.*]]: index, %[[M:.*]]: index)
etensor.graph @event_types(%n: index, %m: index) {
  // CHECK: etensor.event(%[[N]]) count 4 : !etensor.event<?>
  %e0 = etensor.event(%n) count 4 : !etensor.event<?>
  // CHECK: etensor.event(%[[N]], %[[M]]) count 1 : !etensor.event<?x8x?>
  %e1 = etensor.event(%n, %m) count 1 : !etensor.event<?x8x?>
  // CHECK: etensor.event() count 0 : !etensor.event<>
  %e2 = etensor.event() count 0 : !etensor.event<>
  // CHECK: etensor.event() count 2 {name = "static"} : !etensor.event<2x3>
  %e3 = etensor.event() count 2 {name = "static"} : !etensor.event<2x3>
}

// CHECK-LABEL: etensor.graph @wait_counts
etensor.graph @wait_counts(%n: index, %counts: memref<?xi32>) {
  %c4 = arith.constant 4 : index
  // CHECK: %[[K:.*]] = arith.muli
  %k = arith.muli %n, %c4 : index
  // CHECK: etensor.event(%{{.*}}) count %[[K]] : !etensor.event<?>
  %e0 = etensor.event(%n) count %k : !etensor.event<?>
  // CHECK: etensor.event(%{{.*}}) count from %{{.*}} : memref<?xi32> : !etensor.event<?>
  %e1 = etensor.event(%n) count from %counts : memref<?xi32> : !etensor.event<?>
}

// CHECK-LABEL: etensor.graph @splitk
etensor.graph @splitk(%n: index, %A: memref<?x256xf32>, %B: memref<?x4xf32>, %C: memref<?xf32>) attributes {etensor.block_size = 128 : i64} {
  %e = etensor.event(%n) count 4 : !etensor.event<?>
  // CHECK: etensor.task @tile2d grid [%{{.*}}, 4] args(%{{.*}}, %{{.*}} : memref<?x256xf32>, memref<?x4xf32>)
  // CHECK-SAME: outs(%{{.*}}[(d0, d1) -> (d0)] : !etensor.event<?>) {name = "partial"}
  etensor.task @tile2d grid [%n, 4] args(%A, %B : memref<?x256xf32>, memref<?x4xf32>)
      outs(%e[(i, j) -> (i)] : !etensor.event<?>) {name = "partial"}
  // CHECK: etensor.task @tile1d grid [%{{.*}}] args(%{{.*}}, %{{.*}} : memref<?x4xf32>, memref<?xf32>)
  // CHECK-SAME: ins(%{{.*}}[(d0) -> (d0)] : !etensor.event<?>)
  etensor.task @tile1d grid [%n] args(%B, %C : memref<?x4xf32>, memref<?xf32>)
      ins(%e[(i) -> (i)] : !etensor.event<?>)
}

// CHECK-LABEL: etensor.graph @triggered
etensor.graph @triggered(%experts: index, %tiles: index, %indptr: memref<?xi32>, %x: memref<?x64xbf16>, %counts: memref<?xi32>) {
  %ready = etensor.event(%experts) count 1 : !etensor.event<?>
  %done = etensor.event(%experts) count from %counts : memref<?xi32> : !etensor.event<?>
  // CHECK: etensor.task @expert grid [%{{.*}}] args(%{{.*}} : memref<?x64xbf16>)
  // CHECK-SAME: outs(%{{.*}}[(d0, d1) -> (d1)] : !etensor.event<?>)
  // CHECK-SAME: triggered_by(%{{.*}}, %{{.*}} : !etensor.event<?>, memref<?xi32>)
  etensor.task @expert grid [%tiles] args(%x : memref<?x64xbf16>)
      outs(%done[(i, c) -> (c)] : !etensor.event<?>)
      triggered_by(%ready, %indptr : !etensor.event<?>, memref<?xi32>)
}

/// Multi-GPU: a ranked event (dimension 0 is the owning rank), tasks that
/// name their rank, pass it as an `index` argument and bind it to the maps'
/// symbol.
// CHECK-LABEL: etensor.graph @ranked
// CHECK-SAME: (%[[RANKS:.*]]: index, %[[RANK:.*]]: index, %[[T:.*]]: index, %[[P:.*]]: memref<?xi64>, %[[OUT:.*]]: memref<?xf32>)
etensor.graph @ranked(%ranks: index, %rank: index, %tiles: index, %p: memref<?xi64>, %out: memref<?xf32>) {
  // CHECK: %[[RS:.*]] = etensor.event(%[[RANKS]], %[[T]]) count %[[RANKS]] ranked {name = "rs"} : !etensor.event<?x?>
  %rs = etensor.event(%ranks, %tiles) count %ranks ranked {name = "rs"} : !etensor.event<?x?>
  // CHECK: etensor.event() count 1 ranked : !etensor.event<8x4>
  %st = etensor.event() count 1 ranked : !etensor.event<8x4>
  // CHECK: etensor.task @scatter grid [%[[RANKS]], %[[T]]] rank(%[[RANK]]) args(%[[RANK]], %[[P]] : index, memref<?xi64>)
  // CHECK-SAME: outs(%[[RS]][(d0, d1) -> (d0, d1)] : !etensor.event<?x?>)
  etensor.task @scatter grid [%ranks, %tiles] rank(%rank) args(%rank, %p : index, memref<?xi64>)
      outs(%rs[(r, i) -> (r, i)] : !etensor.event<?x?>)
  // CHECK: etensor.task @reduce grid [%[[T]]] rank(%[[RANK]]) args(%[[RANK]], %[[OUT]] : index, memref<?xf32>)
  // CHECK-SAME: ins(%[[RS]][(d0)[s0] -> (s0, d0)] : !etensor.event<?x?>) {name = "reduce"}
  etensor.task @reduce grid [%tiles] rank(%rank) args(%rank, %out : index, memref<?xf32>)
      ins(%rs[(i)[r] -> (r, i)] : !etensor.event<?x?>) {name = "reduce"}
  // CHECK: etensor.task @reduce grid [4] rank(%[[RANK]]) args(%[[RANK]], %[[OUT]] : index, memref<?xf32>)
  // CHECK-SAME: outs(%{{.*}}[(d0)[s0] -> ((s0 + 1) mod 8, d0)] : !etensor.event<8x4>)
  etensor.task @reduce grid [4] rank(%rank) args(%rank, %out : index, memref<?xf32>)
      outs(%st[(i)[r] -> ((r + 1) mod 8, i)] : !etensor.event<8x4>)
}

// CHECK-LABEL: etensor.graph @static_schedule_level
etensor.graph @static_schedule_level(%n: index, %B: memref<?x4xf32>, %C: memref<?xf32>) {
  %e = etensor.event(%n) count 4 : !etensor.event<?>
  // CHECK: etensor.worker static {
  etensor.worker static {
    // CHECK: etensor.dispatch 0 grid [%{{.*}}] attributes {name = "final"} {
    // CHECK-NEXT: ^bb0(%[[I:.*]]: index):
    etensor.dispatch 0 grid [%n] attributes {name = "final"} {
    ^bb0(%i: index):
      // CHECK: etensor.wait %{{.*}}[%[[I]]] : !etensor.event<?>
      etensor.wait %e[%i] : !etensor.event<?>
      func.call @tile1d(%i, %B, %C) : (index, memref<?x4xf32>, memref<?xf32>) -> ()
      // CHECK: etensor.notify %{{.*}}[%[[I]]] : !etensor.event<?>
      etensor.notify %e[%i] : !etensor.event<?>
    }
  }
}

// CHECK-LABEL: etensor.graph @dynamic_schedule_level
etensor.graph @dynamic_schedule_level(%n: index, %cap: index) {
  %e = etensor.event(%n) count 1 : !etensor.event<?>
  // CHECK: %[[Q:.*]] = etensor.queue capacity %{{.*}} : !etensor.queue
  %q = etensor.queue capacity %cap : !etensor.queue
  // CHECK: etensor.worker dynamic(%[[Q]] : !etensor.queue) {
  etensor.worker dynamic(%q : !etensor.queue) {
    etensor.dispatch 0 grid [%n, 2] {
    ^bb0(%i: index, %j: index):
      // CHECK: %[[DONE:.*]] = etensor.notify %{{.*}}[%{{.*}}] : !etensor.event<?> -> i1
      %done = etensor.notify %e[%i] : !etensor.event<?> -> i1
      scf.if %done {
        // CHECK: etensor.push %[[Q]][1, %{{.*}}] : !etensor.queue
        etensor.push %q[1, %i] : !etensor.queue
      }
    }
    etensor.dispatch 1 grid [%n] {
    ^bb0(%i: index):
      %c2 = arith.constant 2 : index
      %end = arith.addi %i, %c2 : index
      // CHECK: %[[OK:.*]] = etensor.check_range %{{.*}}, %{{.*}} of task 0 at %{{.*}} bound %{{.*}}
      %ok = etensor.check_range %i, %end of task 0 at %i bound %n
      // CHECK: arith.select %[[OK]]
      %count = arith.select %ok, %c2, %i : index
      // CHECK: etensor.push %[[Q]][0, %{{.*}}] count %{{.*}} : !etensor.queue
      etensor.push %q[0, %i] count %count : !etensor.queue
      // CHECK: etensor.retire %[[Q]] count %{{.*}} : !etensor.queue
      etensor.retire %q count %c2 : !etensor.queue
      etensor.yield
    }
  }
}

// CHECK-LABEL: etensor.graph @triggered_dispatch
etensor.graph @triggered_dispatch(%n: index, %tiles: index, %cap: index, %indptr: memref<?xi32>, %x: memref<?x64xbf16>) {
  %ready = etensor.event(%n) count 1 : !etensor.event<?>
  %q = etensor.queue capacity %cap : !etensor.queue
  etensor.worker dynamic(%q : !etensor.queue) {
    // CHECK: etensor.dispatch 0 grid [%{{.*}}] triggered_by(%{{.*}}, %{{.*}} : !etensor.event<?>, memref<?xi32>) {
    // CHECK-NEXT: ^bb0(%[[I:.*]]: index, %[[C:.*]]: index):
    // CHECK-NEXT: func.call @expert(%[[I]], %[[C]], %{{.*}})
    etensor.dispatch 0 grid [%tiles] triggered_by(%ready, %indptr : !etensor.event<?>, memref<?xi32>) {
    ^bb0(%i: index, %c: index):
      func.call @expert(%i, %c, %x) : (index, index, memref<?x64xbf16>) -> ()
    }
  }
}

// CHECK-LABEL: etensor.graph @ticketed_dispatch
etensor.graph @ticketed_dispatch(%tiles: index, %indptr: memref<129xi32>, %x: memref<?x64xbf16>) {
  %ready = etensor.event() count 1 : !etensor.event<128>
  %tickets = etensor.event() count 1 : !etensor.event<1>
  etensor.worker static {
    // CHECK: etensor.dispatch 0 grid [%{{.*}}] triggered_by(%{{.*}}, %{{.*}} : !etensor.event<128>, memref<129xi32>) ticket(%{{.*}} : !etensor.event<1>) attributes {guarded_indptr} {
    etensor.dispatch 0 grid [%tiles] triggered_by(%ready, %indptr : !etensor.event<128>, memref<129xi32>) ticket(%tickets : !etensor.event<1>) attributes {guarded_indptr} {
    ^bb0(%i: index, %c: index):
      func.call @expert(%i, %c, %x) : (index, index, memref<?x64xbf16>) -> ()
    }
  }
}

// CHECK-LABEL: func.func @pop
func.func @pop(%q: !etensor.queue) -> (i1, index, index) {
  // CHECK: %{{.*}}, %{{.*}}, %{{.*}} = etensor.pop %{{.*}} : !etensor.queue
  %valid, %task, %instance = etensor.pop %q : !etensor.queue
  return %valid, %task, %instance : i1, index, index
}
