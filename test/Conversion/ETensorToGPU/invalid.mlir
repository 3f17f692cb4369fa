// RUN: etc-opt %s -split-input-file -verify-diagnostics --convert-etensor-to-gpu

/// IR the verifier accepts but the lowering cannot handle: each case used to
/// crash convert-etensor-to-gpu or the PTX backend (found by
/// test/unit/test_fuzz_invalid_ir.py) and is now a diagnostic.

func.func @tile(%i: index) {
  return
}

// Queue entries keep 15 bits for the task above a 48-bit instance.
etensor.graph @task_index_too_large() {
  etensor.worker static {
    // expected-error @+1 {{task index 32767 does not fit the queue descriptor (at most 32766)}}
    etensor.dispatch 32767 grid [1] {
    ^bb0(%i: index):
      func.call @tile(%i) : (index) -> ()
    }
  }
}

// -----

func.func @tile(%i: index) {
  return
}

// The waits looked up an event that no etensor.event declared.
etensor.graph @cast_event(%n: index) {
  %e0 = etensor.event(%n) count 1 : !etensor.event<?>
  // expected-error @+1 {{'builtin.unrealized_conversion_cast' op uses a value of type '!etensor.event<?>' that convert-etensor-to-gpu cannot map into the kernel}}
  %e = builtin.unrealized_conversion_cast %e0 : !etensor.event<?> to !etensor.event<?>
  etensor.worker static {
    etensor.dispatch 0 grid [%n] {
    ^bb0(%i: index):
      etensor.wait %e[%i] : !etensor.event<?>
      func.call @tile(%i) : (index) -> ()
    }
  }
}

// -----

func.func @tile(%i: index) {
  return
}

// The clone kept a use of the graph's event after the graph was erased.
etensor.graph @event_in_body(%n: index) {
  %e = etensor.event(%n) count 1 : !etensor.event<?>
  etensor.worker static {
    etensor.dispatch 0 grid [%n] {
    ^bb0(%i: index):
      // expected-error @+1 {{uses a value of type '!etensor.event<?>' that convert-etensor-to-gpu cannot map into the kernel}}
      %x = builtin.unrealized_conversion_cast %e : !etensor.event<?> to index
      func.call @tile(%x) : (index) -> ()
      etensor.notify %e[%i] : !etensor.event<?>
    }
  }
}

// -----

func.func @tile(%i: index) {
  return
}

// The NVPTX printer aborts on a kernel name it would have to quote.
// expected-error @+1 {{name 'a@b' is not a PTX identifier ([a-zA-Z_$][a-zA-Z0-9_$]*), so it cannot name the kernel}}
etensor.graph @"a@b"(%n: index) {
  etensor.worker static {
    etensor.dispatch 0 grid [%n] {
    ^bb0(%i: index):
      func.call @tile(%i) : (index) -> ()
    }
  }
}

// -----

// The queue reached LLVM translation as an unrealized cast, reported without
// a location.
func.func @tile(%i: index) {
  %c0 = arith.constant 0 : index
  // expected-error @+1 {{'etensor.queue' op cannot appear in a device function; events and queues belong to the graph}}
  %q = etensor.queue capacity %c0 : !etensor.queue
  return
}

etensor.graph @queue_in_device_function(%n: index) {
  etensor.worker static {
    etensor.dispatch 0 grid [%n] {
    ^bb0(%i: index):
      func.call @tile(%i) : (index) -> ()
    }
  }
}

// -----

// LLVM asserted on the alignment when translating the kernel module.
// expected-error @+1 {{'memref.global' op alignment 281474976710656 exceeds LLVM's maximum of 4294967296}}
memref.global "private" @tile__smem : memref<8xf32, #gpu.address_space<workgroup>> {alignment = 281474976710656 : i64}
func.func @tile(%i: index) {
  %s = memref.get_global @tile__smem : memref<8xf32, #gpu.address_space<workgroup>>
  return
}

etensor.graph @huge_alignment(%n: index) {
  etensor.worker static {
    etensor.dispatch 0 grid [%n] {
    ^bb0(%i: index):
      func.call @tile(%i) : (index) -> ()
    }
  }
}

// -----

/// One tile in two shared regions: its buffer cannot be apart from itself,
/// and a prefetch run ahead would write what the other instance reads.
func.func @tile(%i: index) {
  return
}

// expected-error @+1 {{'etensor.graph' op function 'tile' is called by tasks in shared regions 0 and 1: a tile's shared memory belongs to one region}}
etensor.graph @tile_in_two_regions(%n: index) {
  etensor.worker static {
    etensor.dispatch 0 grid [%n] {
    ^bb0(%i: index):
      func.call @tile(%i) : (index) -> ()
    }
    etensor.dispatch 1 grid [%n] attributes {shared_region = 1} {
    ^bb0(%i: index):
      func.call @tile(%i) : (index) -> ()
    }
  }
}

// -----

/// A buffer reached from the tiles of two regions (through a helper).
// expected-error @+1 {{'memref.global' op 'helper__smem' is used by tasks in shared regions 0 and 1 (through 'b'): a buffer belongs to one region}}
memref.global "private" @helper__smem : memref<8xf32, #gpu.address_space<workgroup>>
func.func @helper(%i: index) {
  %s = memref.get_global @helper__smem : memref<8xf32, #gpu.address_space<workgroup>>
  return
}
func.func @a(%i: index) {
  func.call @helper(%i) : (index) -> ()
  return
}
func.func @b(%i: index) {
  func.call @helper(%i) : (index) -> ()
  return
}

etensor.graph @buffer_in_two_regions(%n: index) {
  etensor.worker static {
    etensor.dispatch 0 grid [%n] {
    ^bb0(%i: index):
      func.call @a(%i) : (index) -> ()
    }
    etensor.dispatch 1 grid [%n] attributes {shared_region = 1} {
    ^bb0(%i: index):
      func.call @b(%i) : (index) -> ()
    }
  }
}
