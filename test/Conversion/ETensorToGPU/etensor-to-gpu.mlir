// RUN: etc-opt %s -split-input-file -verify-diagnostics --convert-etensor-to-gpu="watchdog-polls=1000" | FileCheck %s

func.func @final_sum(%i: index, %c: memref<?xf32>) {
  return
}

/// One persistent kernel per graph: the graph's arguments, then the counters,
/// the static queue, the status record and the watchdog bound.
// CHECK-LABEL: module attributes {gpu.container_module}
// CHECK: gpu.module @splitk_kernels {
// CHECK: func.func private @final_sum
// CHECK: gpu.func @splitk(%[[N:.*]]: index, %[[C:.*]]: memref<?xf32>, %[[COUNTERS:.*]]: memref<?xi32>, %[[QUEUE:.*]]: memref<?xi64>, %[[STATUS:.*]]: memref<?xi32>, %[[POLLS:.*]]: index) kernel
// CHECK-SAME: etensor.watchdog_polls = 1000 : i64
// CHECK-SAME: known_block_size = array<i32: 256, 1, 1>
/// This CTA's slice of the static queue.
// CHECK: %[[CTA:.*]] = gpu.block_id x
// CHECK: memref.load %[[QUEUE]][%[[CTA]]] : memref<?xi64>
// CHECK: scf.for
// CHECK: %[[ENTRY:.*]] = memref.load %[[QUEUE]]
// CHECK: arith.shrui %[[ENTRY]], %{{.*}} : i64
// CHECK: scf.index_switch
// CHECK: case 0 {
/// wait: thread 0 polls with acquire loads and backoff under a watchdog...
// CHECK: scf.while
// CHECK: llvm.inline_asm has_side_effects "ld.acquire.gpu.global.u32 $0, [$1];"
// CHECK: llvm.inline_asm has_side_effects "ld.relaxed.gpu.global.u32 $0, [$1];"
// CHECK: llvm.inline_asm has_side_effects "nanosleep.u32 $0;"
/// ...records the first expiry...
// CHECK: llvm.inline_asm has_side_effects "atom.relaxed.gpu.global.cas.b32 $0, [$1], 0, 1;"
// CHECK: memref.store %{{.*}}, %[[STATUS]]
/// ...and the CTA joins on a barrier that also broadcasts failure.
// CHECK: bar.red.or.pred
// CHECK: scf.if
// CHECK: func.call @final_sum
/// No notify in this task: the CTA still joins before the next task.
// CHECK: gpu.barrier
// CHECK: default {
// CHECK: gpu.return
// CHECK-NOT: etensor.graph
etensor.graph @splitk(%n: index, %c: memref<?xf32>) {
  %e = etensor.event(%n) count 4 : !etensor.event<?>
  etensor.worker static {
    etensor.dispatch 0 grid [%n] {
    ^bb0(%i: index):
      etensor.wait %e[%i] : !etensor.event<?>
      func.call @final_sum(%i, %c) : (index, memref<?xf32>) -> ()
    }
  }
}

// -----

func.func @tile(%i: index) {
  return
}

/// notify: CTA barrier, then one thread does a release reduction. Events are
/// laid out one after another in %counters; the block size comes from the
/// graph.
// CHECK-LABEL: gpu.func @two_events
// CHECK-SAME: known_block_size = array<i32: 128, 1, 1>
// CHECK: case 0 {
// CHECK: gpu.barrier
// CHECK: %[[TID:.*]] = gpu.thread_id x
// CHECK: arith.cmpi eq, %[[TID]]
// CHECK: llvm.inline_asm has_side_effects "red.release.gpu.global.add.u32 [$0], 1;", "l"
etensor.graph @two_events(%n: index) attributes {etensor.block_size = 128 : i64} {
  %a = etensor.event(%n) count 1 : !etensor.event<?>
  %b = etensor.event() count 1 : !etensor.event<4>
  etensor.worker static {
    etensor.dispatch 0 grid [4] {
    ^bb0(%i: index):
      func.call @tile(%i) : (index) -> ()
      etensor.notify %b[%i] : !etensor.event<4>
    }
  }
}

// -----

func.func private @tile(%i: index)

// expected-error @+1 {{has no etensor.worker; run a scheduling pass first}}
etensor.graph @unscheduled(%n: index) {
}

// -----

func.func @tile(%i: index) {
  return
}

etensor.graph @wait_after_body(%n: index) {
  %e = etensor.event(%n) count 1 : !etensor.event<?>
  etensor.worker static {
    etensor.dispatch 0 grid [%n] {
    ^bb0(%i: index):
      func.call @tile(%i) : (index) -> ()
      // expected-error @+1 {{must come before every other op of its dispatch body}}
      etensor.wait %e[%i] : !etensor.event<?>
    }
  }
}
