// RUN: etc-opt %s -split-input-file -verify-diagnostics --convert-etensor-to-gpu | FileCheck %s

/// A tile gets workgroup (shared) memory from a memref.global in that address
/// space: the global moves into the kernel module with the function that
/// reads it (as a view of the kernel's one workgroup buffer), and leaves the
/// host module.

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
// CHECK: func.func private @tile
// CHECK: %[[B:.*]] = memref.get_global @__etc_workgroup : memref<32xi8, #gpu.address_space<workgroup>>
// CHECK: memref.view %[[B]][%{{.*}}][] : memref<32xi8, #gpu.address_space<workgroup>> to memref<8xf32, #gpu.address_space<workgroup>>
// CHECK: memref.global "private" @__etc_workgroup : memref<32xi8, #gpu.address_space<workgroup>> {alignment = 16 : i64}
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

/// Tiles run one at a time on a CTA (which joins after each instance), so
/// the buffers of different tiles overlap: @a (1 KiB) and @b (512 B) both sit
/// at offset 0. The two buffers @b uses with its helper @b_helper's @c are
/// used together, so @c goes after @b (offset 512): the kernel needs 1 KiB,
/// not 1.75 KiB.

memref.global "private" @a__smem : memref<256xf32, #gpu.address_space<workgroup>>
memref.global "private" @b__smem : memref<128xf32, #gpu.address_space<workgroup>>
memref.global "private" @c__smem : memref<64xf32, #gpu.address_space<workgroup>>
func.func @a(%i: index) {
  %s = memref.get_global @a__smem : memref<256xf32, #gpu.address_space<workgroup>>
  %one = arith.constant 1.0 : f32
  memref.store %one, %s[%i] : memref<256xf32, #gpu.address_space<workgroup>>
  return
}
func.func @b_helper(%i: index) {
  %s = memref.get_global @c__smem : memref<64xf32, #gpu.address_space<workgroup>>
  %one = arith.constant 1.0 : f32
  memref.store %one, %s[%i] : memref<64xf32, #gpu.address_space<workgroup>>
  return
}
func.func @b(%i: index) {
  %s = memref.get_global @b__smem : memref<128xf32, #gpu.address_space<workgroup>>
  %one = arith.constant 1.0 : f32
  memref.store %one, %s[%i] : memref<128xf32, #gpu.address_space<workgroup>>
  func.call @b_helper(%i) : (index) -> ()
  return
}

// CHECK-LABEL: gpu.module @overlay_kernels
// CHECK-DAG: memref.global "private" @__etc_workgroup : memref<1024xi8, #gpu.address_space<workgroup>>
// CHECK-DAG: %[[C512:.*]] = arith.constant 512 : index
// CHECK-DAG: memref.view %{{.*}}[%[[C512]]][] : memref<1024xi8, #gpu.address_space<workgroup>> to memref<64xf32, #gpu.address_space<workgroup>>
// CHECK-NOT: @a__smem
etensor.graph @overlay(%n: index) {
  etensor.worker static {
    etensor.dispatch 0 grid [%n] {
    ^bb0(%i: index):
      func.call @a(%i) : (index) -> ()
    }
    etensor.dispatch 1 grid [%n] {
    ^bb0(%i: index):
      func.call @b(%i) : (index) -> ()
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

// -----

/// Past 47 KiB the tiles' buffer becomes dynamic shared memory: an external,
/// unsized declaration (`.extern .shared` in PTX), its size on the kernel for
/// the launch to pass (here 64 KiB).

memref.global "private" @big__smem : memref<16384xf32, #gpu.address_space<workgroup>> {alignment = 1024 : i64}
func.func @big(%i: index) {
  %s = memref.get_global @big__smem : memref<16384xf32, #gpu.address_space<workgroup>>
  %c0 = arith.constant 0 : index
  %one = arith.constant 1.0 : f32
  memref.store %one, %s[%c0] : memref<16384xf32, #gpu.address_space<workgroup>>
  return
}

/// The host module keeps each kernel's size: the kernel module becomes a
/// binary before the compiler reads it.
// CHECK: module attributes {etensor.dynamic_shared_memory = {dynamic = 65536 : i64}, gpu.container_module}
// CHECK-NEXT: gpu.module @dynamic_kernels {
// CHECK: memref.get_global @__etc_workgroup : memref<0xi8, #gpu.address_space<workgroup>>
// CHECK: memref.view %{{.*}}[%{{.*}}][] : memref<0xi8, #gpu.address_space<workgroup>> to memref<16384xf32, #gpu.address_space<workgroup>>
// CHECK: memref.global "public" @__etc_workgroup : memref<0xi8, #gpu.address_space<workgroup>> {alignment = 1024 : i64}
// CHECK: gpu.func @dynamic
// CHECK-SAME: etensor.dynamic_shared_memory = 65536 : i64
etensor.graph @dynamic(%n: index) {
  etensor.worker static {
    etensor.dispatch 0 grid [%n] {
    ^bb0(%i: index):
      func.call @big(%i) : (index) -> ()
    }
  }
}

// -----

/// More than an sm_90 CTA can have (226 KiB for the tiles) is an error.

memref.global "private" @huge__smem : memref<65536xf32, #gpu.address_space<workgroup>>
func.func @huge(%i: index) {
  %s = memref.get_global @huge__smem : memref<65536xf32, #gpu.address_space<workgroup>>
  %c0 = arith.constant 0 : index
  %one = arith.constant 1.0 : f32
  memref.store %one, %s[%c0] : memref<65536xf32, #gpu.address_space<workgroup>>
  return
}

// expected-error @+1 {{'gpu.func' op needs 262144 bytes of shared memory for its tiles, over the 231424 an sm_90 CTA can have}}
etensor.graph @too_big(%n: index) {
  etensor.worker static {
    etensor.dispatch 0 grid [%n] {
    ^bb0(%i: index):
      func.call @huge(%i) : (index) -> ()
    }
  }
}

// -----

/// A static worker that draws (a pooled or ticketed task) broadcasts each
/// draw through a `.shared` word of its own (a workgroup attribution: as
/// part of the tiles' buffer it cost a ticketed MoE layer up to 18 %); the
/// tiles' buffer behind it starts on a 128-byte line even when the tiles
/// ask for 16 bytes (at 16, the decoder's B = 1 kernel took 20 % longer).

memref.global "private" @small__smem : memref<256xf32, #gpu.address_space<workgroup>> {alignment = 16 : i64}
func.func @small(%i: index) {
  %s = memref.get_global @small__smem : memref<256xf32, #gpu.address_space<workgroup>>
  %one = arith.constant 1.0 : f32
  memref.store %one, %s[%i] : memref<256xf32, #gpu.address_space<workgroup>>
  return
}

// CHECK-LABEL: gpu.module @drawn_kernels {
// CHECK: memref.global "private" @__etc_workgroup : memref<1024xi8, #gpu.address_space<workgroup>> {alignment = 128 : i64}
// CHECK: gpu.func @drawn({{[^)]*}}) workgroup(%{{.*}} : memref<1xi64, #gpu.address_space<workgroup>>) kernel
etensor.graph @drawn(%n: index) {
  %pools = etensor.event() count 1 {name = "pool.small"} : !etensor.event<1>
  etensor.worker static {
    etensor.dispatch 0 grid [%n] pool(%pools : !etensor.event<1>) {
    ^bb0(%i: index):
      func.call @small(%i) : (index) -> ()
    }
  }
}

// -----

/// A workgroup global that no function of the graph reads (a tile's declared
/// but unused buffer) is dropped: on the host its address space cannot
/// lower.

memref.global "private" @tile__smem : memref<8xf32, #gpu.address_space<workgroup>> {alignment = 16 : i64}
memref.global "private" @tile__unused : memref<1xi32, #gpu.address_space<workgroup>> {alignment = 4 : i64}
func.func @tile(%i: index) {
  %s = memref.get_global @tile__smem : memref<8xf32, #gpu.address_space<workgroup>>
  %one = arith.constant 1.0 : f32
  memref.store %one, %s[%i] : memref<8xf32, #gpu.address_space<workgroup>>
  return
}

// CHECK-LABEL: module attributes {gpu.container_module}
// CHECK-NOT: @tile__unused
// CHECK: gpu.module @unused_kernels {
// CHECK-NOT: @tile__unused
// CHECK: gpu.func @unused
// CHECK-NOT: @tile__unused
etensor.graph @unused(%n: index) {
  etensor.worker static {
    etensor.dispatch 0 grid [%n] {
    ^bb0(%i: index):
      func.call @tile(%i) : (index) -> ()
    }
  }
}
