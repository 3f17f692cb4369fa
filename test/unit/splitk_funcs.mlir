// The device functions of the paper's Figure 3 (one thread per tile), for tests.
func.func @partial_sum(%i: index, %j: index, %A: memref<?x256xf32>, %B: memref<?x4xf32>) {
  %tid = gpu.thread_id x
  %c0 = arith.constant 0 : index
  %cond = arith.cmpi eq, %tid, %c0 : index
  scf.if %cond {
    %c64 = arith.constant 64 : index
    %c1 = arith.constant 1 : index
    %lo = arith.muli %j, %c64 : index
    %hi = arith.addi %lo, %c64 : index
    %zero = arith.constant 0.0 : f32
    %s = scf.for %k = %lo to %hi step %c1 iter_args(%acc = %zero) -> f32 {
      %v = memref.load %A[%i, %k] : memref<?x256xf32>
      %n = arith.addf %acc, %v : f32
      scf.yield %n : f32
    }
    memref.store %s, %B[%i, %j] : memref<?x4xf32>
  }
  return
}
func.func @final_sum(%i: index, %B: memref<?x4xf32>, %C: memref<?xf32>) {
  %tid = gpu.thread_id x
  %c0 = arith.constant 0 : index
  %cond = arith.cmpi eq, %tid, %c0 : index
  scf.if %cond {
    %c1 = arith.constant 1 : index
    %c4 = arith.constant 4 : index
    %zero = arith.constant 0.0 : f32
    %s = scf.for %k = %c0 to %c4 step %c1 iter_args(%acc = %zero) -> f32 {
      %v = memref.load %B[%i, %k] : memref<?x4xf32>
      %n = arith.addf %acc, %v : f32
      scf.yield %n : f32
    }
    memref.store %s, %C[%i] : memref<?xf32>
  }
  return
}
