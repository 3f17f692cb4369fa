// RUN: etc-opt %s -split-input-file -verify-diagnostics --convert-etensor-to-gpu | FileCheck %s

/// A tile gets workgroup (shared) memory from a memref.global in that address
/// space: the global moves into the kernel module with the function that
/// reads it, and leaves the host module.

memref.global "private" @tile__smem : memref<8xf32, #gpu.address_space<workgroup>> {alignment = 16 : i64}
func.func @tile(%i: index) {
  %s = memref.get_global @tile__smem : memref<8xf32, #gpu.address_space<workgroup>>
  %c0 = arith.constant 0 : index
  %one = arith.constant 1.0 : f32
  memref.store %one, %s[%c0] : memref<8xf32, #gpu.address_space<workgroup>>
  return
}

// CHECK-LABEL: module attributes {gpu.container_module}
// CHECK-NOT: memref.global
// CHECK: gpu.module @smem_kernels {
// CHECK-DAG: memref.global "private" @tile__smem : memref<8xf32, #gpu.address_space<workgroup>> {alignment = 16 : i64}
// CHECK-DAG: func.func private @tile
// CHECK: gpu.func @smem
// CHECK: }
// CHECK-NOT: memref.global
etensor.graph @smem(%n: index) {
  etensor.worker static {
    etensor.dispatch 0 grid [%n] {
    ^bb0(%i: index):
      func.call @tile(%i) : (index) -> ()
    }
  }
}

// -----

/// NVPTX has no stack slots in shared memory: a workgroup alloca is rejected
/// here rather than crashing the LLVM backend.
func.func @tile(%i: index) {
  // expected-error @+1 {{'memref.alloca' op outside the default or private memory space cannot lower on NVPTX}}
  %s = memref.alloca() : memref<8xf32, #gpu.address_space<workgroup>>
  return
}

etensor.graph @alloca(%n: index) {
  etensor.worker static {
    etensor.dispatch 0 grid [%n] {
    ^bb0(%i: index):
      func.call @tile(%i) : (index) -> ()
    }
  }
}

// -----

/// Private (local) memory stack slots are fine.
// CHECK-LABEL: gpu.module @private_alloca_kernels
// CHECK: memref.alloca() : memref<8xf32, #gpu.address_space<private>>
func.func @tile(%i: index) {
  %s = memref.alloca() : memref<8xf32, #gpu.address_space<private>>
  return
}

etensor.graph @private_alloca(%n: index) {
  etensor.worker static {
    etensor.dispatch 0 grid [%n] {
    ^bb0(%i: index):
      func.call @tile(%i) : (index) -> ()
    }
  }
}
