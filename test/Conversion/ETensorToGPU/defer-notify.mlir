// RUN: etc-opt %s --etensor-static-schedule --convert-etensor-to-gpu="defer-notify=true" | FileCheck %s
// RUN: etc-opt %s --etensor-static-schedule --convert-etensor-to-gpu | FileCheck %s --check-prefix=OFF

/// With defer-notify, `tile`'s notification of the constant coordinate
/// done[0] is held back: the static loop carries the CTA's count of them (an
/// index, 0 at first); each instance whose body ran adds one; the case of
/// another task, and the end of the loop, make them with one release add of
/// the count by thread 0, before anything else. The notification of
/// each[i] (a coordinate per instance) is made at once, as without it.
// CHECK-LABEL: gpu.func @held
// CHECK: %[[LOOP:.*]]:2 = scf.for %{{.*}} = %{{.*}} to %{{.*}} step %{{.*}} iter_args(%{{.*}} = %true, %[[HELD:[^ ,)]*]] = %c0{{[_0-9]*}}) -> (i1, index)
// CHECK: case 0 {
// CHECK: func.call @tile
// CHECK-NOT: "red.release.gpu.global.add.u32 [$0], $1;"
// CHECK: "red.release.gpu.global.add.u32 [$0], 1;"
// CHECK: arith.addi %[[HELD]], %{{.*}} : index
// CHECK: case 1 {
// CHECK: %[[ANY:.*]] = arith.cmpi ne, %[[HELD]], %c0
// CHECK: %[[GO:.*]] = arith.andi %[[ANY]], %{{.*}} : i1
// CHECK: scf.if %[[GO]] {
// CHECK: "red.release.gpu.global.add.u32 [$0], $1;"
// CHECK: ld.acquire.gpu.global.u32
// CHECK: func.call @sink
// CHECK: case 2 {
// CHECK: "red.release.gpu.global.add.u32 [$0], $1;"
// CHECK: func.call @step
// CHECK: %[[LEFT:.*]] = arith.cmpi ne, %[[LOOP]]#1, %c0
// CHECK: arith.andi %[[LEFT]]
// CHECK: "red.release.gpu.global.add.u32 [$0], $1;"
// CHECK: gpu.return

/// Without it, every notification is made by its instance.
// OFF-LABEL: gpu.func @held
// OFF-NOT: "red.release.gpu.global.add.u32 [$0], $1;"
// OFF: gpu.return
func.func @tile(%i: index) { return }
func.func @sink(%i: index) { return }
func.func @step(%i: index) { return }
etensor.graph @held(%n: index) {
  %done = etensor.event() count %n {name = "done"} : !etensor.event<1>
  %each = etensor.event(%n) count 1 {name = "each"} : !etensor.event<?>
  etensor.task @tile grid [%n] outs(%done[(i) -> (0)] : !etensor.event<1>, %each[(i) -> (i)] : !etensor.event<?>)
  etensor.task @sink grid [1] ins(%done[(i) -> (0)] : !etensor.event<1>)
  etensor.task @step grid [%n] ins(%each[(i) -> (i)] : !etensor.event<?>)
}
