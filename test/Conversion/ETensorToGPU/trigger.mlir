// RUN: etc-opt %s --etensor-static-schedule --convert-etensor-to-gpu | FileCheck %s --check-prefix=STATIC
// RUN: etc-opt %s --etensor-dynamic-schedule --convert-etensor-to-gpu | FileCheck %s --check-prefix=DYNAMIC

/// A data-dependent trigger. Static: the in-edge wait; then the coordinate c
/// from a parallel count of indptr entries <= i (bar.red.popc) and a wait
/// for the trigger's coordinate c alone; indptr[c], indptr[c+1] are read
/// again once it completed and the CTA agrees (bar.red.and) that i lies
/// between them. Otherwise (a table still being written, i past indptr[C],
/// or i the bound's last instance, which must see whether a range lies past
/// the bound) every thread polls its share of the coordinates (a strided
/// scf.for), the CTA joins with bar.red.or, checks every range of the now
/// final table against the grid (a bad one is recorded as state 4 and
/// refused: bar.red.or over the ranges) and counts again. The body runs
/// only below indptr[C]. The in-edge wait on a constant coordinate of an
/// event whose count is known at launch (`planned`) is polled by thread 0
/// only until the CTA saw it complete (a flag the static loop carries; other
/// tasks' waits on it use the flag too); the CTA always joins.
// STATIC: func.func private @__etc_check_counts_{{[0-9]+}}(%[[COUNTERS:.*]]: memref<?xi32>, %{{.*}}: memref<?xi32>, %[[TABLE:.*]]: memref<?xi32>,
// STATIC: scf.for
// STATIC: ld.relaxed.gpu.global.u32
// STATIC: memref.load %[[TABLE]]
// STATIC: arith.cmpi sgt
// STATIC: atom.relaxed.gpu.global.cas.b32 $0, [$1], 0, 5;
// STATIC-LABEL: gpu.func @moe
// STATIC: scf.for %{{.*}} = %{{.*}} to %{{.*}} step %{{.*}} iter_args(%{{.*}} = %true, %[[SEEN:.*]] = %false) -> (i1, i1)
// STATIC: scf.index_switch
// STATIC: case 2 {
// STATIC: %[[NOT_SEEN:.*]] = arith.xori %[[SEEN]], %{{.*}} : i1
// STATIC: %[[POLLS:.*]] = arith.andi %{{.*}}, %[[NOT_SEEN]] : i1
// STATIC: scf.if %[[POLLS]] -> (i32)
// STATIC: ld.acquire.gpu.global.u32
// STATIC: bar.red.or.pred
// STATIC: arith.ori %[[SEEN]], %{{.*}} : i1
// STATIC: scf.if %{{.*}} -> (i1, index, i1)
// STATIC: bar.red.popc.u32
// STATIC: scf.if %{{.*}} -> (i1, i1)
// STATIC: ld.acquire.gpu.global.u32
// STATIC: bar.red.or.pred
// STATIC: memref.load %arg2
// STATIC: memref.load %arg2
// STATIC: bar.red.and.pred
// STATIC: %[[LAST:.*]] = arith.subi %arg1, %c1{{.*}} : index
// STATIC: arith.cmpi eq, %{{.*}}, %[[LAST]] : index
// STATIC: scf.if %{{.*}} -> (i1, index, i1)
// STATIC: scf.for %{{.*}} = %{{.*}} to %{{.*}} step %{{.*}} iter_args
// STATIC: ld.acquire.gpu.global.u32
// STATIC: bar.red.or.pred
// STATIC: scf.if %{{.*}} -> (i1)
// STATIC: scf.for %{{.*}} = %c0{{.*}} to %arg0 step %{{.*}} iter_args
// STATIC: %[[BEGIN:.*]] = arith.index_cast %{{.*}} : i32 to index
// STATIC: %[[END:.*]] = arith.index_cast %{{.*}} : i32 to index
// STATIC: arith.cmpi eq, %[[BEGIN]], %c0{{.*}} : index
// STATIC: arith.cmpi sle, %[[BEGIN]], %[[END]] : index
// STATIC: arith.cmpi sle, %[[END]], %arg1 : index
// STATIC: atom.relaxed.gpu.global.cas.b32 $0, [$1], 0, 4;
// STATIC: bar.red.or.pred
// STATIC: bar.red.popc.u32
// STATIC: arith.andi
// STATIC: scf.if
// STATIC: func.call @expert
/// As the launch ends, the last CTA checks every coordinate of `done`, whose
/// counts come from a table: more notifications than the count is state 5
/// (its waiters were released early); then, after a barrier (the zeroing
/// threads would race the reads), it zeroes the counters. The check
/// is a function of its own that the kernel calls (no_inline), so its code
/// does not move ptxas's allocation of the inlined kernel.
// STATIC: atom.acq_rel.gpu.global.add.u32
// STATIC: func.call @[[CHECK:__etc_check_counts_[0-9]+]](%arg4, %arg6, %arg3, {{.*}}) {no_inline}
// STATIC-NEXT: gpu.barrier
// STATIC: scf.for %{{.*}} = %thread_id_x{{.*}} to %{{.*}} step %block_dim_x
// STATIC: memref.store %c0_i32{{.*}}, %arg4

/// Dynamic: every pop compares its position with the capacity less the
/// retired word (queue word 2). The notification that completes a trigger
/// coordinate checks its range against the grid before pushing it (state 4
/// when it does not fit), and the last one retires the unused bound with
/// one atomic. A popped instance counts its coordinate and is refused
/// (state 4, thread 0 records it) unless it lies in that range.
// DYNAMIC: func.func private @__etc_check_counts_{{[0-9]+}}
// DYNAMIC: atom.relaxed.gpu.global.cas.b32 $0, [$1], 0, 5;
// DYNAMIC-LABEL: gpu.func @moe
// DYNAMIC: ld.relaxed.gpu.global.u64
// DYNAMIC: atom.relaxed.gpu.global.cas.b32 $0, [$1], 0, 4;
// DYNAMIC: red.relaxed.gpu.global.add.u64
// DYNAMIC: bar.red.popc.u32
// DYNAMIC: memref.load %arg2
// DYNAMIC: memref.load %arg2
// DYNAMIC: atom.relaxed.gpu.global.cas.b32 $0, [$1], 0, 4;
// DYNAMIC: func.call @expert
// DYNAMIC: atom.acq_rel.gpu.global.add.u32
// DYNAMIC: func.call @__etc_check_counts_{{[0-9]+}}({{.*}}) {no_inline}

func.func @plan(%i: index) { return }
func.func @gather(%e: index) { return }
func.func @expert(%i: index, %c: index) { return }
etensor.graph @moe(%experts: index, %tiles: index, %indptr: memref<?xi32>, %counts: memref<?xi32>) {
  %planned = etensor.event() count 1 {name = "planned"} : !etensor.event<1>
  %ready = etensor.event(%experts) count 1 {name = "ready"} : !etensor.event<?>
  %done = etensor.event(%experts) count from %counts : memref<?xi32> {name = "done"} : !etensor.event<?>
  etensor.task @plan grid [1] outs(%planned[(i) -> (0)] : !etensor.event<1>)
  etensor.task @gather grid [%experts] ins(%planned[(e) -> (0)] : !etensor.event<1>) outs(%ready[(e) -> (e)] : !etensor.event<?>, %done[(e) -> (e)] : !etensor.event<?>)
  etensor.task @expert grid [%tiles] ins(%planned[(i, c) -> (0)] : !etensor.event<1>) outs(%done[(i, c) -> (c)] : !etensor.event<?>) triggered_by(%ready, %indptr : !etensor.event<?>, memref<?xi32>)
  etensor.task @gather grid [%experts] ins(%done[(e) -> (e)] : !etensor.event<?>)
}

/// A triggered task's prefetch needs its coordinate: the static lowering
/// calls it once the count of indptr entries found c and before the wait for
/// the trigger's coordinate c, having read indptr[c] and indptr[c+1]; after
/// the wait it reads them again, and when they moved (a table still being
/// written) or the second search runs, the guessed prefetch's copies are
/// drained (cp.async.wait_all) and it runs again for the coordinate found.
/// The dynamic lowering pops instances whose trigger completed: the
/// prefetch comes after the count, before the in-edge wait.
// STATIC-LABEL: gpu.func @moe_prefetched
// STATIC: case 2 {
// STATIC: ld.acquire.gpu.global.u32
// STATIC: bar.red.or.pred
// STATIC-NOT: func.call @expert__prefetch
// STATIC: bar.red.popc.u32
// STATIC: scf.if %{{.*}} -> (i1, i1)
// STATIC: %[[SEEN_LO:.*]] = arith.index_cast %{{.*}} : i32 to index
// STATIC: %[[SEEN_HI:.*]] = arith.index_cast %{{.*}} : i32 to index
// STATIC-NEXT: func.call @expert__prefetch
// STATIC: ld.acquire.gpu.global.u32
// STATIC: %[[LO:.*]] = arith.index_cast %{{.*}} : i32 to index
// STATIC: %[[HI:.*]] = arith.index_cast %{{.*}} : i32 to index
// STATIC-DAG: arith.cmpi eq, %[[LO]], %[[SEEN_LO]] : index
// STATIC-DAG: arith.cmpi eq, %[[HI]], %[[SEEN_HI]] : index
// STATIC: bar.red.and.pred
// STATIC: scf.for %{{.*}} = %{{.*}} to %{{.*}} step %{{.*}} iter_args
// STATIC: bar.red.popc.u32
// STATIC: cp.async.wait_all
// STATIC: scf.if
// STATIC-NEXT: func.call @expert__prefetch
// STATIC: func.call @expert(
// DYNAMIC-LABEL: gpu.func @moe_prefetched
// DYNAMIC: bar.red.popc.u32
// DYNAMIC: func.call @expert__prefetch
// DYNAMIC: ld.acquire.gpu.global.u32
// DYNAMIC: func.call @expert(
func.func @expert__prefetch(%i: index, %c: index) { return }
etensor.graph @moe_prefetched(%experts: index, %tiles: index, %indptr: memref<?xi32>) {
  %planned = etensor.event() count 1 {name = "planned"} : !etensor.event<1>
  %ready = etensor.event(%experts) count 1 {name = "ready"} : !etensor.event<?>
  etensor.task @plan grid [1] outs(%planned[(i) -> (0)] : !etensor.event<1>)
  etensor.task @gather grid [%experts] ins(%planned[(e) -> (0)] : !etensor.event<1>) outs(%ready[(e) -> (e)] : !etensor.event<?>)
  etensor.task @expert grid [%tiles] ins(%planned[(i, c) -> (0)] : !etensor.event<1>) triggered_by(%ready, %indptr : !etensor.event<?>, memref<?xi32>) {prefetch = @expert__prefetch}
}

/// `guarded_indptr`: the in-edges made the table final, so the static loop
/// carries it in registers (thread t holds indptr[t], loaded by the CTA's
/// first instance that needs it: the inner scf.if, which also checks every
/// range against the grid and keeps the table only when all fit) and each
/// instance finds
/// its coordinate with one bar.red.popc over them, runs its prefetch and
/// waits for that coordinate alone: no second read of the range, no CTA
/// vote on it, no whole-event slow path. The dynamic lowering ignores it.
// STATIC-LABEL: gpu.func @moe_guarded
// STATIC: scf.for %{{.*}} = %{{.*}} to %{{.*}} step %{{.*}} iter_args(%{{.*}} = %true, %{{.*}} = %false, %[[ENTRY:[^ ,]*]] = %c0{{[_0-9]*}}, %[[LOADED:[^ ,)]*]] = %false{{[_0-9]*}}) -> (i1, i1, index, i1)
// STATIC: case 2 {
// STATIC: bar.red.or.pred
// STATIC: scf.if %{{.*}} -> (i1, index, i1, index)
// STATIC: scf.if %[[LOADED]] -> (index, i1)
// STATIC-NEXT: %[[TRUE:.*]] = arith.constant true
// STATIC-NEXT: scf.yield %[[ENTRY]], %[[TRUE]] : index, i1
// STATIC: memref.load %arg1
// STATIC: atom.relaxed.gpu.global.cas.b32 $0, [$1], 0, 4;
// STATIC: bar.red.or.pred
// STATIC: bar.red.popc.u32
// STATIC: func.call @expert__prefetch
// STATIC: ld.acquire.gpu.global.u32
// STATIC: bar.red.or.pred
// STATIC-NOT: bar.red.and.pred
// STATIC-NOT: memref.load %arg1
// STATIC: arith.ori %[[LOADED]], %{{.*}} : i1
// STATIC: func.call @expert(
// DYNAMIC-LABEL: gpu.func @moe_guarded
// DYNAMIC: bar.red.popc.u32
// DYNAMIC: func.call @expert(
etensor.graph @moe_guarded(%tiles: index, %indptr: memref<129xi32>) {
  %planned = etensor.event() count 1 {name = "planned"} : !etensor.event<1>
  %ready = etensor.event() count 1 {name = "ready"} : !etensor.event<128>
  etensor.task @plan grid [1] outs(%planned[(i) -> (0)] : !etensor.event<1>)
  etensor.task @gather grid [128] ins(%planned[(e) -> (0)] : !etensor.event<1>) outs(%ready[(e) -> (e)] : !etensor.event<128>)
  etensor.task @expert grid [%tiles] ins(%planned[(i, c) -> (0)] : !etensor.event<1>) triggered_by(%ready, %indptr : !etensor.event<128>, memref<129xi32>) {prefetch = @expert__prefetch, guarded_indptr}
}
