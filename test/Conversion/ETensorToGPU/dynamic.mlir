// RUN: etc-opt %s --convert-etensor-to-gpu | FileCheck %s
// RUN: etc-opt %s --convert-etensor-to-gpu | FileCheck %s --check-prefix=NORETIRE
// RUN: etc-opt %s --convert-etensor-to-gpu="pop-ahead=false" | FileCheck %s --check-prefix=NOAHEAD

/// No data-dependent trigger, so nothing is ever retired: the pops compare
/// positions with the capacity and never load the queue's retired word.
// NORETIRE-NOT: ld.relaxed.gpu.global.u64

func.func @produce(%i: index) {
  return
}
func.func @consume(%i: index) {
  return
}

/// The dynamic worker: thread 0 claims queue positions in chunks from the
/// head, requesting the next chunk ahead of time (the first positions are
/// the ready-at-start instances, the rest ring slots it polls), broadcasts
/// the descriptor through workgroup memory, the CTA runs the task, then
/// thread 0 alone notifies and pushes.
// CHECK-LABEL: gpu.func @pipeline
// CHECK: %[[SLOT:.*]] = memref.view %{{.*}}[%{{.*}}][] : memref<{{[0-9]+}}xi8, #gpu.address_space<workgroup>> to memref<1xi64, #gpu.address_space<workgroup>>
// CHECK: memref.view %{{.*}}[%{{.*}}][] : memref<{{[0-9]+}}xi8, #gpu.address_space<workgroup>> to memref<38xi64, #gpu.address_space<workgroup>>
// CHECK: %[[FIRST:.*]] = scf.if
// CHECK: "atom.relaxed.gpu.global.add.u64 $0, [$1], $2;"
// CHECK: scf.while (%[[PENDING:.*]] = %[[FIRST]], %[[NEXT:.*]] = %{{.*}}, %[[END:.*]] = %{{.*}}) : (i64, index, index)
// CHECK: arith.cmpi ult, %[[NEXT]], %[[END]] : index
// CHECK: "atom.relaxed.gpu.global.add.u64 $0, [$1], $2;"
// CHECK: "ld.acquire.gpu.global.u64 $0, [$1];"
// CHECK: memref.store %{{.*}}, %[[SLOT]][%{{.*}}] : memref<1xi64, #gpu.address_space<workgroup>>
// CHECK: gpu.barrier
// CHECK: memref.load %[[SLOT]]
// CHECK: scf.index_switch
// CHECK: case 0 {
// CHECK: func.call @produce
// CHECK: gpu.barrier
/// Completing notification: acq_rel, compared with the wait count...
// CHECK: "atom.acq_rel.gpu.global.add.u32 $0, [$1], 1;"
/// ...then the push claims its ring slots and publishes them with one fence
/// and relaxed stores (each a release by PTX's release pattern); a full
/// queue is reported (state 3), never written.
// CHECK: "fence.acq_rel.gpu;"
// CHECK: "atom.relaxed.gpu.global.add.u64 $0, [$1], $2;"
// CHECK: "atom.relaxed.gpu.global.cas.b32 $0, [$1], 0, 3;"
// CHECK: "st.relaxed.gpu.global.u64 [$0], $1;"
// CHECK: case 1 {
// CHECK: func.call @consume
// CHECK: gpu.return
/// Without pop-ahead no position is requested before the loop: the first
/// head request is the pop's, when the CTA has no position left.
// NOAHEAD-LABEL: gpu.func @pipeline
// NOAHEAD-NOT: atom.relaxed.gpu.global.add.u64
// NOAHEAD: scf.while (%{{.*}}, %[[NEXT:.*]] = %{{.*}}, %[[END:.*]] = %{{.*}}) : (i64, index, index)
// NOAHEAD: %[[LOCAL:.*]] = arith.cmpi ult, %[[NEXT]], %[[END]] : index
// NOAHEAD: %[[REQ:.*]] = scf.if %[[LOCAL]] -> (i64) {
// NOAHEAD: } else {
// NOAHEAD: "atom.relaxed.gpu.global.add.u64 $0, [$1], $2;"
// NOAHEAD: %[[START:.*]] = arith.index_cast %[[REQ]] : i64 to index
// NOAHEAD: arith.select %[[LOCAL]], %[[NEXT]], %[[START]] : index
etensor.graph @pipeline(%n: index) {
  %e = etensor.event(%n) count 1 : !etensor.event<?>
  %c2 = arith.constant 2 : index
  %instances = arith.muli %n, %c2 : index
  %q = etensor.queue capacity %instances : !etensor.queue
  etensor.worker dynamic(%q : !etensor.queue) {
    etensor.dispatch 0 grid [%n] attributes {etensor.ready_at_start} {
    ^bb0(%i: index):
      func.call @produce(%i) : (index) -> ()
      %done = etensor.notify %e[%i] : !etensor.event<?> -> i1
      scf.if %done {
        etensor.push %q[1, %i] : !etensor.queue
      }
    }
    etensor.dispatch 1 grid [%n] {
    ^bb0(%i: index):
      func.call @consume(%i) : (index) -> ()
    }
  }
}

/// A range push: thread 0 zeroes the record's count, and where the push
/// runs claims the slots and leaves (first slot, first instance, count) in
/// workgroup memory; after a barrier every thread reads the record once,
/// and those below the count fence once and store their share of the slots
/// (k = tid, tid + blockDim, ...).
// CHECK-LABEL: gpu.func @fanout
// CHECK: %[[REC:.*]] = memref.view %{{.*}}[%{{.*}}][] : memref<{{[0-9]+}}xi8, #gpu.address_space<workgroup>> to memref<38xi64, #gpu.address_space<workgroup>>
// CHECK: func.call @produce
// CHECK: scf.if
// CHECK: memref.store %{{.*}}, %[[REC]][%{{.*}}]
// CHECK: "atom.acq_rel.gpu.global.add.u32 $0, [$1], 1;"
// CHECK: scf.if
// CHECK: "atom.relaxed.gpu.global.add.u64 $0, [$1], $2;"
// CHECK-COUNT-3: memref.store %{{.*}}, %[[REC]][%{{.*}}]
// CHECK: gpu.barrier
// CHECK-COUNT-3: memref.load %[[REC]]
// CHECK: %[[COUNT:.*]] = arith.index_cast %{{.*}} : i64 to index
// CHECK: %[[MOST:.*]] = arith.maxui %{{.*}}, %[[COUNT]] : index
// CHECK: %[[TID:.*]] = gpu.thread_id x
// CHECK: %[[MINE:.*]] = arith.cmpi ult, %[[TID]], %[[MOST]] : index
// CHECK: scf.if %[[MINE]] {
// CHECK-NEXT: llvm.inline_asm has_side_effects "fence.acq_rel.gpu;"
// CHECK-NOT: memref.load %[[REC]]
// CHECK: %[[DIM:.*]] = gpu.block_dim x
// CHECK: scf.for %{{.*}} = %[[TID]] to %[[COUNT]] step %[[DIM]]
// CHECK: "st.relaxed.gpu.global.u64 [$0], $1;"
// CHECK: func.call @consume
etensor.graph @fanout(%n: index) {
  %c0 = arith.constant 0 : index
  %one = arith.constant 1 : index
  %e = etensor.event(%one) count 1 : !etensor.event<?>
  %c2 = arith.constant 2 : index
  %instances = arith.addi %n, %one : index
  %q = etensor.queue capacity %instances : !etensor.queue
  etensor.worker dynamic(%q : !etensor.queue) {
    etensor.dispatch 0 grid [%one] attributes {etensor.ready_at_start} {
    ^bb0(%i: index):
      func.call @produce(%i) : (index) -> ()
      %done = etensor.notify %e[%c0] : !etensor.event<?> -> i1
      scf.if %done {
        etensor.push %q[1, %c0] count %n : !etensor.queue
      }
    }
    etensor.dispatch 1 grid [%n] {
    ^bb0(%i: index):
      func.call @consume(%i) : (index) -> ()
    }
  }
}

/// A fan-out loop (a one-coordinate in-edge's completion updating every
/// instance's ready counter, DynamicSchedule's mixed in-edges): thread 0
/// only records, in the words after the range-push records, that the loop
/// runs and the values it needs from thread 0's section (here the bound);
/// after the section's barrier every thread loads the record and takes
/// iterations tid, tid + blockDim, ..., with its own atomics.
// CHECK-LABEL: gpu.func @mixed_fanout
// CHECK: %[[REC:.*]] = memref.view %{{.*}}[%{{.*}}][] : memref<{{[0-9]+}}xi8, #gpu.address_space<workgroup>> to memref<38xi64, #gpu.address_space<workgroup>>
// CHECK: func.call @produce
// CHECK: %[[C24:.*]] = arith.constant 24 : index
// CHECK: memref.store %{{.*}}, %[[REC]][%[[C24]]]
// CHECK: "atom.acq_rel.gpu.global.add.u32 $0, [$1], 1;"
// CHECK: scf.if
// CHECK: memref.store %{{.*}}, %[[REC]][%{{.*}}]
// CHECK: memref.store %{{.*}}, %[[REC]][%{{.*}}]
// CHECK-NOT: "atom.relaxed.gpu.global.add.u64
// CHECK: gpu.barrier
// CHECK: memref.load %[[REC]]
// CHECK: scf.if
// CHECK: %[[TID:.*]] = gpu.thread_id x
// CHECK: %[[DIM:.*]] = gpu.block_dim x
// CHECK: scf.for %[[K:.*]] = %{{.*}} to %{{.*}} step %{{.*}}
// CHECK: "atom.acq_rel.gpu.global.add.u32 $0, [$1], 1;"
// CHECK: "fence.acq_rel.gpu;"
// CHECK: "atom.relaxed.gpu.global.add.u64 $0, [$1], $2;"
// CHECK: func.call @consume
etensor.graph @mixed_fanout(%n: index) {
  %c0 = arith.constant 0 : index
  %one = arith.constant 1 : index
  %e = etensor.event(%one) count 1 : !etensor.event<?>
  %ready = etensor.event(%n) count 2 : !etensor.event<?>
  %instances = arith.addi %n, %one : index
  %q = etensor.queue capacity %instances : !etensor.queue
  etensor.worker dynamic(%q : !etensor.queue) {
    etensor.dispatch 0 grid [%one] attributes {etensor.ready_at_start} {
    ^bb0(%i: index):
      func.call @produce(%i) : (index) -> ()
      %done = etensor.notify %e[%c0] : !etensor.event<?> -> i1
      scf.if %done {
        %bound = arith.addi %n, %c0 : index
        scf.for %k = %c0 to %bound step %one {
          %r = etensor.notify %ready[%k] : !etensor.event<?> -> i1
          scf.if %r {
            etensor.push %q[1, %k] : !etensor.queue
          }
        }
      }
    }
    etensor.dispatch 1 grid [%n] {
    ^bb0(%i: index):
      func.call @consume(%i) : (index) -> ()
    }
  }
}

/// A range push inside a loop of thread 0 cannot use one record: it keeps
/// the thread-0 lowering (claim, then a loop of slot stores), and the
/// section has no CTA-wide store loop.
// CHECK-LABEL: gpu.func @looped
// CHECK: func.call @produce
// CHECK: scf.for
// CHECK: "fence.acq_rel.gpu;"
// CHECK: "atom.relaxed.gpu.global.add.u64 $0, [$1], $2;"
// CHECK: scf.for
// CHECK: "st.relaxed.gpu.global.u64 [$0], $1;"
// CHECK-NOT: gpu.block_dim
// CHECK: func.call @consume
etensor.graph @looped(%n: index) {
  %c0 = arith.constant 0 : index
  %one = arith.constant 1 : index
  %two = arith.constant 2 : index
  %e = etensor.event(%one) count 1 : !etensor.event<?>
  %instances = arith.addi %n, %one : index
  %q = etensor.queue capacity %instances : !etensor.queue
  etensor.worker dynamic(%q : !etensor.queue) {
    etensor.dispatch 0 grid [%one] attributes {etensor.ready_at_start} {
    ^bb0(%i: index):
      func.call @produce(%i) : (index) -> ()
      %done = etensor.notify %e[%c0] : !etensor.event<?> -> i1
      %half = arith.divui %n, %two : index
      scf.for %k = %c0 to %two step %one {
        %first = arith.muli %k, %half : index
        etensor.push %q[1, %first] count %half : !etensor.queue
      }
    }
    etensor.dispatch 1 grid [%n] {
    ^bb0(%i: index):
      func.call @consume(%i) : (index) -> ()
    }
  }
}
