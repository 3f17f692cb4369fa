// RUN: etc-opt %s --etensor-static-schedule --convert-etensor-to-gpu="outline=tile" | FileCheck %s
// RUN: etc-opt %s --etensor-static-schedule --convert-etensor-to-gpu="outline=*" | FileCheck %s --check-prefix=ALL
// RUN: etc-opt %s --etensor-static-schedule --convert-etensor-to-gpu | FileCheck %s --check-prefix=OFF
// RUN: not etc-opt %s --etensor-static-schedule --convert-etensor-to-gpu="outline=nosuch" 2>&1 | FileCheck %s --check-prefix=BAD
// RUN: etc-opt %s --etensor-static-schedule --convert-etensor-to-gpu="outline=tile" --inline | FileCheck %s --check-prefix=INLINED

/// `outline` marks the kernel's calls of the named device functions
/// `no_inline` (all of them with `*`), so the pipeline's inliner leaves them
/// as calls and ptxas allocates their registers apart.
func.func @producer(%i: index, %w: memref<?xf32>) {
  return
}
func.func @tile(%i: index, %w: memref<?xf32>) {
  %c0 = arith.constant 0 : index
  %x = memref.load %w[%c0] : memref<?xf32>
  memref.store %x, %w[%i] : memref<?xf32>
  return
}

// CHECK-LABEL: gpu.func @outlined
// CHECK: func.call @producer(%{{.*}}) : (index, memref<?xf32>) -> ()
// CHECK: func.call @tile(%{{.*}}) {no_inline} : (index, memref<?xf32>) -> ()

// ALL-LABEL: gpu.func @outlined
// ALL: func.call @producer(%{{.*}}) {no_inline}
// ALL: func.call @tile(%{{.*}}) {no_inline}

// OFF-LABEL: gpu.func @outlined
// OFF-NOT: no_inline

// After the inliner only the outlined tile is still called.
// INLINED-LABEL: gpu.func @outlined
// INLINED-NOT: func.call @producer
// INLINED: func.call @tile(%{{.*}}) {no_inline}

// BAD: error: 'etensor.graph' op outline names 'nosuch', which the kernel never calls
etensor.graph @outlined(%n: index, %w: memref<?xf32>) {
  %e = etensor.event() count 1 : !etensor.event<1>
  etensor.task @producer grid [1] args(%w : memref<?xf32>) outs(%e[(i) -> (0)] : !etensor.event<1>)
  etensor.task @tile grid [%n] args(%w : memref<?xf32>) ins(%e[(i) -> (0)] : !etensor.event<1>)
}
