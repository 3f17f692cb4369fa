// RUN: not etc-opt %s --etc-static-to-ptx="opt-level=7" 2>&1 | FileCheck %s --check-prefix=OPT
// RUN: not etc-opt %s --etc-dynamic-to-ptx="opt-level=-1" 2>&1 | FileCheck %s --check-prefix=OPTNEG
// RUN: not etc-opt %s --etc-static-to-ptx="format=pdf" 2>&1 | FileCheck %s --check-prefix=FORMAT
// RUN: not etc-opt %s --etc-static-to-ptx="chip=" 2>&1 | FileCheck %s --check-prefix=CHIP
// RUN: not etc-opt %s --etc-static-to-ptx="chip=sm_90x" 2>&1 | FileCheck %s --check-prefix=CHIPX
// RUN: not etc-opt %s --etc-static-to-ptx="features=+ptx80,ptx81" 2>&1 | FileCheck %s --check-prefix=FEATURES
// RUN: not etc-opt %s --etc-static-to-ptx="block-size=2048" 2>&1 | FileCheck %s --check-prefix=BLOCK
// RUN: not etc-opt %s --etc-static-to-ptx="watchdog-polls=0" 2>&1 | FileCheck %s --check-prefix=POLLS
// RUN: not etc-opt %s --etc-static-to-ptx="min-ctas-per-sm=-3" 2>&1 | FileCheck %s --check-prefix=OCC
// RUN: not etc-opt %s --etc-dynamic-to-ptx="max-pop-chunk=0" 2>&1 | FileCheck %s --check-prefix=POP

/// Pipeline options out of range are errors naming the option and its value.
/// An opt-level outside 0..3, an unknown format, an empty chip and a feature
/// without its sign used to abort etc-opt inside upstream passes
/// (`#nvvm.target` built unchecked; an unknown format reported, then read
/// anyway; LLVM's assertions), an unknown chip compiled for no target, the
/// block size and poll count compiled kernels no launch could run, and the
/// last two printed the value as a garbled character.

// OPT: error: etc-to-ptx: opt-level=7 is outside 0..3
// OPTNEG: error: etc-to-ptx: opt-level=-1 is outside 0..3
// FORMAT: error: etc-to-ptx: format='pdf' is not one of isa, bin, fatbin, llvm
// CHIP: error: etc-to-ptx: chip='' is not an SM architecture such as sm_90 or sm_90a
// CHIPX: error: etc-to-ptx: chip='sm_90x' is not an SM architecture
// FEATURES: error: etc-to-ptx: features='+ptx80,ptx81': each comma-separated feature starts with '+' or '-'
// BLOCK: error: 'etensor.graph' op block size must be in 1..1024 threads (a CUDA block's most), got 2048
// POLLS: error: 'etensor.graph' op watchdog-polls must be >= 1, got 0
// OCC: error: 'etensor.graph' op min-ctas-per-sm must be >= 0, got -3
// POP: error: 'etensor.graph' op max-pop-chunk must be >= 1, got 0

func.func @tile(%i: index, %a: memref<?xf32>) {
  %one = arith.constant 1.0 : f32
  memref.store %one, %a[%i] : memref<?xf32>
  return
}
etensor.graph @one(%n: index, %a: memref<?xf32>) {
  etensor.task @tile grid [%n] args(%a : memref<?xf32>)
}
