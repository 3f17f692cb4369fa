// RUN: etc-opt %s --convert-etensor-to-gpu="trace=true" | FileCheck %s --check-prefix=TRACE
// RUN: etc-opt %s --convert-etensor-to-gpu | FileCheck %s --check-prefix=OFF

func.func @traced_tile(%i: index) {
  return
}

/// With trace=true the kernel takes one more buffer and thread 0 appends a
/// record per instance: start after the waits, end after the body.
// TRACE-LABEL: gpu.func @traced
// TRACE-SAME: %[[POLLS:.*]]: index, %[[TRACE:.*]]: memref<?xi64>)
// TRACE: "mov.u64 $0, %globaltimer;"
// TRACE: func.call @traced_tile
// TRACE: "mov.u64 $0, %globaltimer;"
// TRACE: "atom.relaxed.gpu.global.add.u64 $0, [$1], 1;"
// TRACE: "mov.u32 $0, %smid;"
// TRACE: memref.store %{{.*}}, %[[TRACE]]
etensor.graph @traced(%n: index) {
  etensor.worker static {
    etensor.dispatch 0 grid [%n] {
    ^bb0(%i: index):
      func.call @traced_tile(%i) : (index) -> ()
    }
  }
}

/// Off (the default), the kernel has no tracing code and no extra parameter.
// OFF-LABEL: gpu.func @traced
// OFF-SAME: %{{.*}}: index) kernel
// OFF-NOT: globaltimer
