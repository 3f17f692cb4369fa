// RUN: etc-opt %s --etc-static-to-ptx | FileCheck %s

/// A tile's memref.global in workgroup memory becomes part of the persistent
/// kernel's one .shared buffer.

memref.global "private" @tile__smem : memref<8xf32, #gpu.address_space<workgroup>> {alignment = 16 : i64}
func.func @tile(%i: index, %a: memref<?xf32>) {
  %s = memref.get_global @tile__smem : memref<8xf32, #gpu.address_space<workgroup>>
  %c0 = arith.constant 0 : index
  %c8 = arith.constant 8 : index
  %tid = gpu.thread_id x
  %slot = arith.remui %tid, %c8 : index
  %v = memref.load %a[%i] : memref<?xf32>
  memref.store %v, %s[%slot] : memref<8xf32, #gpu.address_space<workgroup>>
  gpu.barrier
  %w = memref.load %s[%c0] : memref<8xf32, #gpu.address_space<workgroup>>
  memref.store %w, %a[%i] : memref<?xf32>
  return
}

// CHECK: gpu.binary @smem_kernels
// CHECK-SAME: .shared .align 16 .b8 __etc_workgroup[32];
// CHECK-SAME: st.shared.b32
// CHECK-SAME: bar.sync
// CHECK-SAME: ld.shared.b32
etensor.graph @smem(%n: index, %a: memref<?xf32>) {
  etensor.task @tile grid [%n] args(%a : memref<?xf32>)
}
