// RUN: etc-opt %s --etensor-static-schedule --convert-etensor-to-gpu="queue-ahead=true wait-memo=true" | FileCheck %s
// RUN: etc-opt %s --etensor-static-schedule --convert-etensor-to-gpu | FileCheck %s --check-prefix=OFF

/// queue-ahead: the static loop carries the queue entry of its position,
/// loaded one iteration early (the first before the loop), so the load of
/// entry i + 1 goes out before instance i runs. wait-memo: the loop carries
/// the key (`event id << 40 | coordinate`) of the CTA's last completed wait;
/// a wait with that key skips its poll and join, and a completed wait
/// becomes the memo.
func.func @producer(%i: index, %w: memref<?xf32>) {
  return
}
func.func @tile(%i: index, %w: memref<?xf32>) {
  return
}

// CHECK-LABEL: gpu.func @lists
// CHECK: %[[START:.*]] = arith.select %{{.*}}, %{{.*}}, %{{.*}} : index
// CHECK-NEXT: %[[FIRST:.*]] = memref.load %[[QUEUE:.*]][%[[START]]] : memref<?xi64>
// CHECK: scf.for %[[POS:.*]] = %{{.*}} to %[[END:.*]] step %{{.*}} iter_args(%[[ALIVE:.*]] = %{{.*}}, %[[MEMO:.*]] = %c-1_i64, %[[ENTRY:.*]] = %[[FIRST]]) -> (i1, i64, i64)
// CHECK: %[[NEXT:.*]] = arith.addi %[[POS]], %{{.*}} : index
// CHECK: %[[IN:.*]] = arith.cmpi ult, %[[NEXT]], %[[END]] : index
// CHECK: %[[AT:.*]] = arith.select %[[IN]], %[[NEXT]], %[[POS]] : index
// CHECK: %[[NEXT_ENTRY:.*]] = memref.load %[[QUEUE]][%[[AT]]] : memref<?xi64>
// CHECK: arith.shrui %[[ENTRY]]
// CHECK: scf.index_switch
// The tile's wait: skipped when its key is the memo's.
// CHECK: case 1 {
// CHECK: %[[KEY:.*]] = arith.ori %{{.*}} : i64
// CHECK: %[[HIT:.*]] = arith.cmpi eq, %[[KEY]], %[[MEMO]] : i64
// CHECK: %[[OK:.*]] = scf.if %[[HIT]] -> (i1) {
// CHECK-NEXT: %[[TRUE:.*]] = arith.constant true
// CHECK-NEXT: scf.yield %[[TRUE]] : i1
// CHECK-NEXT: } else {
// CHECK: ld.acquire.gpu.global.u32
// CHECK: %[[NEW:.*]] = arith.select %[[OK]], %[[KEY]], %[[MEMO]] : i64
// CHECK: func.call @tile(
// CHECK: scf.yield %{{.*}}, %[[NEW]] : i1, i64
// CHECK: scf.yield %{{.*}}, %{{.*}}, %[[NEXT_ENTRY]] : i1, i64, i64

// OFF-LABEL: gpu.func @lists
// OFF: scf.for %{{.*}} iter_args(%{{.*}} = %{{.*}}) -> (i1)
// OFF-NOT: arith.cmpi eq, %{{.*}} : i64
etensor.graph @lists(%n: index, %w: memref<?xf32>) {
  %e = etensor.event() count 1 : !etensor.event<1>
  etensor.task @producer grid [1] args(%w : memref<?xf32>) outs(%e[(i) -> (0)] : !etensor.event<1>)
  etensor.task @tile grid [%n] args(%w : memref<?xf32>) ins(%e[(i) -> (0)] : !etensor.event<1>)
}
