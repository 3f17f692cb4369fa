// RUN: etc-opt %s --etensor-static-schedule --convert-etensor-to-gpu | FileCheck %s

/// A `ticketed` task: the static schedule declares its ticket counter
/// (`ticket.tile`, one word after the user's events) and a queue entry of
/// the task runs the instance it draws. Thread 0 takes the ticket drawn
/// ahead at the CTA's previous entry (a loop-carried index, -1 for none) or
/// draws one now (a relaxed atomic add); when the next queue entry is of the
/// same task it draws that entry's ticket now. The ticket reaches the CTA
/// through the workgroup word, and the body's coordinates come from it.
/// Thread 0's draws ahead ride the loop (-1 on the other threads), so the
/// CTA barriers are the non-aligned `barrier.sync`: LLVM may restructure
/// the loop so that lanes of one warp reach different copies of a barrier.
// CHECK-LABEL: gpu.func @balanced
// CHECK: scf.for %{{.*}} = %{{.*}} to %{{.*}} step %{{.*}} iter_args(%{{.*}} = %true, %[[AHEAD:[^ ,)]*]] = %c-1{{[_0-9]*}}) -> (i1, index)
// CHECK: case 1 {
// CHECK: %[[HAVE:.*]] = arith.cmpi ne, %[[AHEAD]], %c-1
// CHECK: scf.if %[[HAVE]] -> (index)
// CHECK: atom.relaxed.gpu.global.add.u32
// CHECK: memref.load %arg{{[0-9]+}}[%{{.*}}] : memref<?xi64>
// CHECK: arith.shrui
// CHECK: atom.relaxed.gpu.global.add.u32
// CHECK: memref.store %{{.*}}, %[[WG:.*]][%{{.*}}] : memref<1xi64, #gpu.address_space<workgroup>>
// CHECK-NOT: gpu.barrier
// CHECK: llvm.call_intrinsic "llvm.nvvm.barrier.cta.sync.all"
// CHECK: %[[T:.*]] = memref.load %[[WG]][%{{.*}}] : memref<1xi64, #gpu.address_space<workgroup>>
// CHECK-NEXT: %[[TICKET:.*]] = arith.index_cast %[[T]] : i64 to index
// CHECK: func.call @tile(%{{.*}})
// CHECK: case 2 {
// CHECK-NOT: atom.relaxed.gpu.global.add.u32
// CHECK: func.call @sink
func.func @plan(%i: index) { return }
func.func @tile(%i: index) { return }
func.func @sink(%i: index) { return }
etensor.graph @balanced(%n: index) {
  %planned = etensor.event() count 1 {name = "planned"} : !etensor.event<1>
  %done = etensor.event() count %n {name = "done"} : !etensor.event<1>
  etensor.task @plan grid [1] outs(%planned[(i) -> (0)] : !etensor.event<1>)
  etensor.task @tile grid [%n] ins(%planned[(i) -> (0)] : !etensor.event<1>) outs(%done[(i) -> (0)] : !etensor.event<1>) {ticketed}
  etensor.task @sink grid [1] ins(%done[(i) -> (0)] : !etensor.event<1>)
}
