// RUN: etc-opt %s --etensor-static-schedule --convert-etensor-to-gpu | FileCheck %s
// RUN: etc-opt %s --etensor-dynamic-schedule --convert-etensor-to-gpu | FileCheck %s --check-prefix=DYN

/// Tasks in different shared regions get shared memory apart, and the static
/// loop runs the prefetch of the CTA's next entry *ahead*, before the waits
/// of the current entry, when the next entry's region differs. The loop
/// carries whether it did; the next entry then skips its own prefetch.
memref.global "private" @a__ring : memref<256xf32, #gpu.address_space<workgroup>>
memref.global "private" @b__ring : memref<128xf32, #gpu.address_space<workgroup>>
func.func @producer(%i: index, %w: memref<?xf32>) {
  return
}
func.func @a(%i: index, %w: memref<?xf32>) {
  %s = memref.get_global @a__ring : memref<256xf32, #gpu.address_space<workgroup>>
  %one = arith.constant 1.0 : f32
  memref.store %one, %s[%i] : memref<256xf32, #gpu.address_space<workgroup>>
  return
}
func.func @a__prefetch(%i: index, %w: memref<?xf32>) {
  %s = memref.get_global @a__ring : memref<256xf32, #gpu.address_space<workgroup>>
  %one = arith.constant 2.0 : f32
  memref.store %one, %s[%i] : memref<256xf32, #gpu.address_space<workgroup>>
  return
}
func.func @b(%i: index, %w: memref<?xf32>) {
  %s = memref.get_global @b__ring : memref<128xf32, #gpu.address_space<workgroup>>
  %one = arith.constant 1.0 : f32
  memref.store %one, %s[%i] : memref<128xf32, #gpu.address_space<workgroup>>
  return
}
func.func @b__prefetch(%i: index, %w: memref<?xf32>) {
  %s = memref.get_global @b__ring : memref<128xf32, #gpu.address_space<workgroup>>
  %one = arith.constant 2.0 : f32
  memref.store %one, %s[%i] : memref<128xf32, #gpu.address_space<workgroup>>
  return
}

// The regions follow each other: @a's ring (region 0) at offset 0, @b's
// (region 1) after it at 1024; the buffer is the sum, 1536 bytes, where one
// region would need 1024.
// CHECK-LABEL: gpu.module @regions_kernels
// CHECK: func.func private @a(
// CHECK: memref.view %{{.*}}[%c0][] : memref<1536xi8, #gpu.address_space<workgroup>> to memref<256xf32
// CHECK: func.func private @b(
// CHECK: memref.view %{{.*}}[%c1024][] : memref<1536xi8, #gpu.address_space<workgroup>> to memref<128xf32
// CHECK: scf.for %[[POS:.*]] = %{{.*}} to %[[END:.*]] step %{{.*}} iter_args(%[[ALIVE:.*]] = %true, %[[AHEAD:.*]] = %false) -> (i1, i1)
// CHECK: %[[NEXT:.*]] = arith.addi %[[POS]]
// The producer (region 0, no prefetch of its own) prefetches @b ahead.
// CHECK: case 0 {
// CHECK: arith.cmpi ult, %[[NEXT]], %[[END]]
// CHECK: case 2 {
// CHECK-NEXT: arith.remui
// CHECK-NEXT: arith.divui
// CHECK-NEXT: func.call @b__prefetch
// CHECK: func.call @producer
// @a: its own prefetch unless the previous entry ran it, then @b's ahead
// (only @b's: @a shares its region with itself), then the wait.
// CHECK: case 1 {
// CHECK: %[[NOTYET:.*]] = arith.xori %[[AHEAD]], %true
// CHECK-NEXT: scf.if %[[NOTYET]] {
// CHECK-NEXT: func.call @a__prefetch
// CHECK-NOT: ld.acquire
// CHECK: scf.index_switch
// CHECK-NEXT: case 2 {
// CHECK-NOT: case 1 {
// CHECK: func.call @b__prefetch
// CHECK: default {
// CHECK: ld.acquire.gpu.global.u32
// CHECK: func.call @a(
// @b (region 1) prefetches @a ahead.
// CHECK: case 2 {
// CHECK: scf.if
// CHECK-NEXT: func.call @b__prefetch
// CHECK: case 1 {
// CHECK: func.call @a__prefetch
// CHECK: ld.acquire.gpu.global.u32
// CHECK: func.call @b(

// The dynamic schedule keeps one region for all (no next entry to prefetch);
// its own words (312 bytes) follow the tiles' 1 KiB.
// DYN-LABEL: gpu.module @regions_kernels
// DYN: memref.global "private" @__etc_workgroup : memref<1336xi8
// DYN-COUNT-1: func.call @b__prefetch
// DYN-NOT: func.call @b__prefetch
etensor.graph @regions(%n: index, %w: memref<?xf32>) {
  %e = etensor.event() count 1 : !etensor.event<1>
  %f = etensor.event(%n) count 1 : !etensor.event<?>
  etensor.task @producer grid [1] args(%w : memref<?xf32>) outs(%e[(i) -> (0)] : !etensor.event<1>)
  etensor.task @a grid [%n] args(%w : memref<?xf32>) ins(%e[(i) -> (0)] : !etensor.event<1>) outs(%f[(i) -> (i)] : !etensor.event<?>) {prefetch = @a__prefetch}
  etensor.task @b grid [%n] args(%w : memref<?xf32>) ins(%f[(i) -> (i)] : !etensor.event<?>) {prefetch = @b__prefetch, shared_region = 1}
}
