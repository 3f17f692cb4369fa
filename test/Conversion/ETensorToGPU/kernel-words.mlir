// RUN: etc-opt %s --etensor-dynamic-schedule --convert-etensor-to-gpu | FileCheck %s

/// The dynamic worker's own words (the broadcast word and 38 push-record
/// words, 312 bytes) are globals placed after the tiles' buffer: in front
/// they pushed the decoder's large-batch tiles to a 1 KiB line and its two
/// CTAs past 196 KiB of shared memory (5.5 % slower).

memref.global "private" @big__smem : memref<256xf32, #gpu.address_space<workgroup>> {alignment = 128 : i64}
func.func @big(%i: index) {
  %s = memref.get_global @big__smem : memref<256xf32, #gpu.address_space<workgroup>>
  %one = arith.constant 1.0 : f32
  memref.store %one, %s[%i] : memref<256xf32, #gpu.address_space<workgroup>>
  return
}

// CHECK-LABEL: gpu.module @popped_kernels {
// CHECK: memref.global "private" @__etc_workgroup : memref<1336xi8, #gpu.address_space<workgroup>> {alignment = 128 : i64}
// CHECK: gpu.func @popped({{[^)]*}}) kernel
// CHECK-DAG: memref.view %{{.*}}[%c1024{{[_0-9]*}}][] : memref<1336xi8, #gpu.address_space<workgroup>> to memref<38xi64, #gpu.address_space<workgroup>>
// CHECK-DAG: memref.view %{{.*}}[%c1328{{[_0-9]*}}][] : memref<1336xi8, #gpu.address_space<workgroup>> to memref<1xi64, #gpu.address_space<workgroup>>
// CHECK-NOT: @__etc_broadcast
// CHECK-NOT: @__etc_push_records
etensor.graph @popped(%n: index) {
  %done = etensor.event(%n) count 1 {name = "done"} : !etensor.event<?>
  etensor.task @big grid [%n] outs(%done[(i) -> (i)] : !etensor.event<?>)
  etensor.task @big grid [%n] ins(%done[(i) -> (i)] : !etensor.event<?>)
}
