// RUN: etc-opt %s --etensor-static-schedule --convert-etensor-to-gpu | FileCheck %s

/// A `pooled` task: its queue entry names a pool (the layer `l`), whose
/// counter is word `l` of `pool.head` (after the user's event). The entry
/// loops: thread 0 takes the instance it drew ahead (or draws now: a relaxed
/// atomic add), draws the next one while two per CTA are left after it,
/// and hands the
/// current one to the CTA through the workgroup word; the loop ends once a
/// draw passes the pool's 64 instances. Draw k of pool l is instance
/// (l, k): linear l * 64 + k. A barrier after the loop keeps the word from
/// being rewritten before every thread read the last draw.
// CHECK-LABEL: gpu.func @pooled
// CHECK: %[[FIELD:.*]] = arith.andi %{{.*}}, %c281474976710655
// CHECK: %[[POOL:.*]] = arith.index_cast %[[FIELD]] : i64 to index
// CHECK: case 0 {
// CHECK: %[[PER:.*]] = arith.muli %c1{{[_0-9]*}}, %c64
// CHECK: arith.addi %{{.*}}, %[[POOL]] : index
// CHECK: scf.while (%[[OK:.*]] = %true{{[_0-9]*}}, %[[AHEAD:.*]] = %c-1{{[_0-9]*}}) : (i1, index) -> (i1, index, index)
// CHECK: %[[HAVE:.*]] = arith.cmpi ne, %[[AHEAD]], %c-1
// CHECK: scf.if %[[HAVE]] -> (index)
// CHECK: atom.relaxed.gpu.global.add.u32
// CHECK: %[[CTAS:.*]] = gpu.grid_dim x
// CHECK: %[[TWICE:.*]] = arith.muli %[[CTAS]], %c2
// CHECK: %[[LEFT:.*]] = arith.addi %{{.*}}, %[[TWICE]] : index
// CHECK: arith.cmpi ult, %[[LEFT]], %[[PER]]
// CHECK: atom.relaxed.gpu.global.add.u32
// CHECK: memref.store %{{.*}}, %[[WG:.*]][%{{.*}}] : memref<1xi64, #gpu.address_space<workgroup>>
// CHECK: llvm.call_intrinsic "llvm.nvvm.barrier.cta.sync.all"
// CHECK: %[[D:.*]] = memref.load %[[WG]][%{{.*}}] : memref<1xi64, #gpu.address_space<workgroup>>
// CHECK: %[[DRAWN:.*]] = arith.index_cast %[[D]] : i64 to index
// CHECK: %[[MORE:.*]] = arith.cmpi ult, %[[DRAWN]], %[[PER]]
// CHECK: %[[GO:.*]] = arith.andi %[[OK]], %[[MORE]]
// CHECK: scf.condition(%[[GO]])
// CHECK: } do {
// CHECK: ^bb0(%{{.*}}: i1, %{{.*}}: index, %[[K:.*]]: index):
// CHECK: arith.remui %[[K]], %[[INNER:.*]] : index
// CHECK: arith.muli %[[POOL]], %[[INNER]]
// CHECK: func.call @head(
// CHECK: red.release.gpu.global.add.u32
// CHECK: scf.yield
// CHECK: }
// CHECK-NEXT: %[[ZERO:.*]] = arith.constant 0 : i32
// CHECK-NEXT: llvm.call_intrinsic "llvm.nvvm.barrier.cta.sync.all"(%[[ZERO]])
// CHECK: case 1 {
// CHECK-NOT: atom.relaxed.gpu.global.add.u32
// CHECK: func.call @sink
func.func @head(%l: index, %j: index) { return }
func.func @sink(%i: index) { return }
etensor.graph @pooled(%layers: index) {
  %done = etensor.event() count 1 {name = "done"} : !etensor.event<1>
  etensor.task @head grid [%layers, 64] outs(%done[(l, j) -> (0)] : !etensor.event<1>) {pooled, pool_dim = 0 : i64}
  etensor.task @sink grid [1] ins(%done[(i) -> (0)] : !etensor.event<1>)
}
