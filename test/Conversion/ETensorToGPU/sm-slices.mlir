// RUN: etc-opt %s --convert-etensor-to-gpu="sm-slices=true" | FileCheck %s
// RUN: etc-opt %s --convert-etensor-to-gpu="record-sm=true" | FileCheck %s --check-prefix=RECORD
// RUN: etc-opt %s --convert-etensor-to-gpu | FileCheck %s --check-prefix=OFF

func.func @tile(%i: index) {
  return
}

/// sm-slices: a CTA takes its queue slice by the SM it runs on when the
/// queue's last word, `S << 8 | occ`, says the runtime dealt it so, the
/// device numbers S SMs and the grid is S * occ: slice k * S + %smid for the
/// k-th CTA to start on its SM (thread 0 counts them on a word after the done
/// counter, and hands the slice over in a second `.shared` word).
// CHECK: gpu.func @slices(%[[N:.*]]: index, %[[COUNTERS:.*]]: memref<?xi32>, %[[QUEUE:.*]]: memref<?xi64>, %{{.*}}: memref<?xi32>, %{{.*}}: index) workgroup(%[[WORDS:.*]] : memref<2xi64, #gpu.address_space<workgroup>>) kernel
// CHECK: %[[CTA:.*]] = gpu.block_id x
// CHECK: %[[GRID:.*]] = gpu.grid_dim x
// CHECK: %[[LEN:.*]] = memref.dim %[[QUEUE]], %{{.*}} : memref<?xi64>
// CHECK: %[[LAST:.*]] = arith.subi %[[LEN]]
// CHECK: %[[WORD:.*]] = memref.load %[[QUEUE]][%[[LAST]]] : memref<?xi64>
// CHECK: %[[SMS:.*]] = arith.index_castui %{{.*}} : i64 to index
// CHECK: %[[OCC:.*]] = arith.index_castui %{{.*}} : i64 to index
// CHECK: scf.if
// CHECK: "mov.u32 $0, %nsmid;"
// CHECK: arith.muli %[[SMS]], %[[OCC]]
// CHECK: scf.if
// CHECK: "mov.u32 $0, %smid;"
// CHECK: "atom.relaxed.gpu.global.add.u32 $0, [$1], 1;"
// CHECK: arith.cmpi ult, %{{.*}}, %[[OCC]]
// CHECK: arith.select
// CHECK: } else {
// CHECK: scf.yield %[[CTA]] : index
// CHECK: memref.store %{{.*}}, %[[WORDS]][%{{.*}}] : memref<2xi64, #gpu.address_space<workgroup>>
// CHECK: gpu.barrier
// CHECK: %[[SLICE_WORD:.*]] = memref.load %[[WORDS]]
// CHECK: %[[SLICE:.*]] = arith.index_cast %[[SLICE_WORD]] : i64 to index
// CHECK: memref.load %[[QUEUE]][%[[SLICE]]] : memref<?xi64>
// CHECK: scf.for
/// (No exit record of the SM: the kernel knows it.) The last CTA zeroes the
/// counters, the done counter and the SMs' counts (the word read again).
// CHECK-NOT: %smid
// CHECK: "atom.acq_rel.gpu.global.add.u32 $0, [$1], 1;"
// CHECK: memref.load %[[QUEUE]]
// CHECK: %[[SMS_AGAIN:.*]] = arith.index_castui
// CHECK: %[[END:.*]] = arith.addi %{{.*}}, %[[SMS_AGAIN]] : index
// CHECK: scf.for %{{.*}} = %{{.*}} to %[[END]]

/// record-sm: the slice is the block index and no word is read before the
/// loop; at its exit each CTA records the SM it ran on in the queue's last
/// gridDim words, for the runtime to deal later launches by.
// RECORD-LABEL: gpu.func @slices
// RECORD-SAME: %{{.*}}: memref<?xi32>, %[[Q:.*]]: memref<?xi64>, %{{.*}}: memref<?xi32>, %{{.*}}: index) kernel
// RECORD-NOT: %nsmid
// RECORD: scf.for
// RECORD: %[[LEN:.*]] = memref.dim %[[Q]], %{{.*}} : memref<?xi64>
// RECORD: %[[FIRST:.*]] = arith.subi %[[LEN]], %{{.*}} : index
// RECORD: %[[AT:.*]] = arith.addi %[[FIRST]], %{{.*}} : index
// RECORD: "mov.u32 $0, %smid;"
// RECORD: memref.store %{{.*}}, %[[Q]][%[[AT]]] : memref<?xi64>
// RECORD: "atom.acq_rel.gpu.global.add.u32 $0, [$1], 1;"
// RECORD: gpu.return

/// Off (the default): no SM is read, before the loop or after it.
// OFF-LABEL: gpu.func @slices
// OFF-SAME: %{{.*}}: index) kernel
// OFF-NOT: smid
// OFF-NOT: memref.dim
// OFF: gpu.return
etensor.graph @slices(%n: index) {
  %e = etensor.event(%n) count 1 : !etensor.event<?>
  etensor.worker static {
    etensor.dispatch 0 grid [%n] {
    ^bb0(%i: index):
      func.call @tile(%i) : (index) -> ()
      etensor.notify %e[%i] : !etensor.event<?>
    }
  }
}
