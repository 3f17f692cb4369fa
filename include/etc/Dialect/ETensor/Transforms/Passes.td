//===- Passes.td - Event tensor passes ---------------------*- tablegen -*-===//
//
// Part of ETC, the Event Tensor Compiler.
//
//===----------------------------------------------------------------------===//

#ifndef ETC_DIALECT_ETENSOR_TRANSFORMS_PASSES_TD
#define ETC_DIALECT_ETENSOR_TRANSFORMS_PASSES_TD

include "mlir/Pass/PassBase.td"

def ETensorVerifyGraph : Pass<"etensor-verify-graph", "::mlir::ModuleOp"> {
  let summary = "Check that every etensor.graph is a runnable dependency DAG";
  let description = [{
    Whole-graph checks that op verifiers cannot make locally. For every
    `etensor.graph` in the module it rejects, with a diagnostic located at
    the offending op:

    - a dependency cycle between tasks (through their events);
    - a constant or symbolic wait count that differs from the fan-in of the
      event, i.e. the number of producer instances whose out-edge reaches a
      coordinate. The fan-in is computed from the maps and the grids,
      symbolically (as an affine expression of the graph's `index`
      arguments) when extents are symbolic;
    - an event that is awaited but never notified, or notified but never
      awaited;
    - a task that can never run (it waits on an event that cannot complete,
      has an empty grid, or depends on such a task).

    Wait counts read from a runtime buffer are data-dependent: they are
    checked at run time, not here.

    #### Input invariant
    Op verifiers pass.

    #### Output IR
    Unchanged. Run before `etensor-static-schedule` or
    `etensor-dynamic-schedule`.
  }];
}

def ETensorStaticSchedule : Pass<"etensor-static-schedule", "::mlir::ModuleOp"> {
  let summary = "Lower task edges to wait/notify inside a static worker loop";
  let description = [{
    Rewrites every `etensor.task` of each `etensor.graph` into an
    `etensor.dispatch` region of one `etensor.worker static` loop. A
    dispatch waits on each of the task's in-edge coordinates
    (`etensor.wait`), calls the device function, then notifies each of its
    out-edge coordinates (`etensor.notify`). The per-CTA order of instances
    is not fixed here: the runtime fills a static queue per concrete shape
    (round-robin over a topological order, which cannot deadlock when all
    CTAs are co-resident).

    Tasks are numbered in a topological order of the task graph; that
    number is the dispatch's `task` attribute and the task index of the
    queue entries.

    A task with a data-dependent trigger keeps it on its dispatch: the
    lowering waits for its in-edges, finds the instance's coordinate `c` in
    `indptr` and waits for the trigger event's coordinate `c` alone
    (checking `c` again once it completed; an instance past `indptr[C]` or
    whose first reading was stale waits for the whole event). Instances at
    or past `indptr[C]` skip the body. The bound grid's unused instances
    cost a slot in the static queue each.

    #### Input invariant
    `etensor-verify-graph` passes.

    #### Output IR
    Graphs with one `etensor.worker static` and no `etensor.task`. Run
    `convert-etensor-to-gpu` next.
  }];
  let dependentDialects = [
    "::mlir::func::FuncDialect", "::mlir::memref::MemRefDialect",
  ];
}

def ETensorDynamicSchedule
    : Pass<"etensor-dynamic-schedule", "::mlir::ModuleOp"> {
  let summary = "Lower task edges to notify/push and an on-GPU ready queue";
  let description = [{
    Rewrites every `etensor.task` of each `etensor.graph` into an
    `etensor.dispatch` region of one `etensor.worker dynamic(%q)` loop over
    a ready queue `%q` (capacity: every task instance, since each is pushed
    exactly once). Instances of tasks without in-edges are ready at start;
    the others are pushed by whoever completes their last dependency:

    - a notification that completes an event coordinate (the counter reaches
      its wait count) pushes every consumer instance whose in-edge maps to
      that coordinate;
    - a consumer with several in-edges gets an implicit `ready.<task>`
      event over its grid, counting its completed in-edges; the notification
      that completes it pushes the instance.

    With `early-push` (the default), consumers are pushed when their last
    producer is *dispatched*, counted on implicit `dispatched.<event>`
    events, and a consumer waits (`etensor.wait`) for the producers'
    *completion* before its body: scheduling latency hides behind the
    producers' work. Without it, pushes happen on completion and no wait is
    needed. Events whose wait count is a table always push on completion:
    the table may not be computed yet when a producer is dispatched.

    Tasks are numbered in the same topological order as
    `etensor-static-schedule`; implicit events are declared after the
    graph's own: ready counters first (in task order), then `fired.<task>`
    counters of triggered tasks (in task order), then dispatch counters (in
    event order).

    A data-dependent trigger `triggered_by(%e, %indptr)` fires when
    coordinate `c` of `%e` *completes* (also with early push: `indptr` is
    only final once the producers ran): it pushes the range
    `[indptr[c], indptr[c+1])`; the last coordinate to fire, counted on
    `fired.<task>`, retires the unused instances of the bound grid
    (`etensor.retire`). A triggered task waits for its other in-edges after
    the pop, so their producers must precede the trigger's producers
    (checked). Every coordinate of `%e` must be notified at least once.

    #### Input invariant
    `etensor-verify-graph` passes. In-edge maps are projections (each result
    a distinct grid dimension or a constant), so the consumers of a
    coordinate can be enumerated.

    #### Output IR
    Graphs with one `etensor.queue`, one `etensor.worker dynamic` and no
    `etensor.task`. Run `convert-etensor-to-gpu` next.
  }];
  let options = [
    Option<"earlyPush", "early-push", "bool", /*default=*/"true",
           "Push consumers when their last producer is dispatched (and wait "
           "for its completion in the consumer) instead of on completion.">,
  ];
  let dependentDialects = [
    "::mlir::arith::ArithDialect", "::mlir::func::FuncDialect",
    "::mlir::memref::MemRefDialect", "::mlir::scf::SCFDialect",
  ];
}

#endif // ETC_DIALECT_ETENSOR_TRANSFORMS_PASSES_TD
