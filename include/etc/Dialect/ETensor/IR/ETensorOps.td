//===- ETensorOps.td - Event tensor operations -------------*- tablegen -*-===//
//
// Part of ETC, the Event Tensor Compiler.
//
//===----------------------------------------------------------------------===//

#ifndef ETC_DIALECT_ETENSOR_IR_ETENSOROPS_TD
#define ETC_DIALECT_ETENSOR_IR_ETENSOROPS_TD

include "etc/Dialect/ETensor/IR/ETensorDialect.td"
include "etc/Dialect/ETensor/IR/ETensorTypes.td"
include "mlir/IR/EnumAttr.td"
include "mlir/IR/SymbolInterfaces.td"
include "mlir/IR/OpAsmInterface.td"
include "mlir/Interfaces/CallInterfaces.td"
include "mlir/Interfaces/ControlFlowInterfaces.td"
include "mlir/Interfaces/FunctionInterfaces.td"
include "mlir/Interfaces/SideEffectInterfaces.td"

//===----------------------------------------------------------------------===//
// Enums
//===----------------------------------------------------------------------===//

def ETensor_ScheduleStatic : I32EnumAttrCase<"Static", 0, "static">;
def ETensor_ScheduleDynamic : I32EnumAttrCase<"Dynamic", 1, "dynamic">;
def ETensor_ScheduleKind : I32EnumAttr<"ScheduleKind",
    "how a worker obtains its task instances",
    [ETensor_ScheduleStatic, ETensor_ScheduleDynamic]> {
  let cppNamespace = "::mlir::etensor";
}

//===----------------------------------------------------------------------===//
// Graph level
//===----------------------------------------------------------------------===//

def ETensor_GraphOp : ETensor_Op<"graph", [
    AutomaticAllocationScope, FunctionOpInterface, IsolatedFromAbove,
    NoTerminator, SingleBlock, Symbol]> {
  let summary = "A megakernel: event tensors and the tasks they connect";
  let description = [{
    `etensor.graph` holds one megakernel. Its `index` arguments are the
    symbolic sizes (batch size, sequence length, ...) bound at launch; its
    `memref` arguments are the buffers the tasks read and write. The body is
    a single block of `etensor.event` and `etensor.task` ops, plus the
    `arith` ops that compute symbolic sizes and wait counts from the
    arguments.

    The body is a dataflow description, not a sequence: every task instance
    may run as soon as its in-edges are satisfied. `etensor-verify-graph`
    checks the whole graph (acyclic, counts consistent, nothing unreachable);
    `etensor-static-schedule` or `etensor-dynamic-schedule` turns it into a
    worker loop.

    Example (the split-K row sum of the paper's Figure 3):

    ```mlir
    etensor.graph @splitk(%n: index, %A: memref<?x256xf32>,
                          %B: memref<?x4xf32>, %C: memref<?xf32>) {
      %e = etensor.event(%n) count 4 : !etensor.event<?>
      etensor.task @partial_sum grid [%n, 4]
          args(%A, %B : memref<?x256xf32>, memref<?x4xf32>)
          outs(%e[(i, j) -> (i)] : !etensor.event<?>)
      etensor.task @final_sum grid [%n]
          args(%B, %C : memref<?x4xf32>, memref<?xf32>)
          ins(%e[(i) -> (i)] : !etensor.event<?>)
    }
    ```
  }];
  let arguments = (ins SymbolNameAttr:$sym_name,
                       TypeAttrOf<FunctionType>:$function_type,
                       OptionalAttr<DictArrayAttr>:$arg_attrs,
                       OptionalAttr<DictArrayAttr>:$res_attrs);
  let regions = (region SizedRegion<1>:$body);
  let hasCustomAssemblyFormat = 1;
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    /// Returns the region on the current operation that is callable.
    ::mlir::Region *getCallableRegion() { return &getBody(); }
    /// Returns the argument types of this graph.
    ::llvm::ArrayRef<::mlir::Type> getArgumentTypes() {
      return getFunctionType().getInputs();
    }
    /// Returns the result types of this graph (always empty).
    ::llvm::ArrayRef<::mlir::Type> getResultTypes() {
      return getFunctionType().getResults();
    }
    ::mlir::Block &getBodyBlock() { return getBody().front(); }
  }];
}

def ETensor_EventOp : ETensor_Op<"event", [
    AttrSizedOperandSegments, MemoryEffects<[MemAlloc]>]> {
  let summary = "Declare an event tensor and its wait counts";
  let description = [{
    Declares an event tensor: one counter per coordinate, all zero when the
    megakernel starts. Each `?` dimension of the result type takes one
    `index` size operand, in order.

    The *wait count* of a coordinate is the number of notifications a waiter
    needs before it may proceed. It is one of:
    - a constant: `count 4`;
    - a symbolic expression, an `index` value computed from the graph's
      arguments: `count %k`;
    - data-dependent, read per coordinate from a runtime integer buffer with
      the event's rank (the Event Tensor paper's *data-dependent event
      update*, e.g. the number of tokens routed to an expert):
      `count from %tokens_per_expert : memref<?xi32>`.

    A `ranked` event spans the ranks (GPUs) that run the same graph, one
    kernel each: dimension 0 is the rank that owns the coordinate. Every
    rank holds a copy of the counters; a notification of coordinate
    `(r, ...)` goes to rank `r`'s copy (a system-scope release atomic on the
    peer's memory), and a wait reads the waiting rank's own copy, so an
    in-edge must address dimension 0 with the task's `rank` (its map's
    symbol). The wait count is the number of notifications from all ranks
    together, so it is checked when the ranks launch, not here.

    Examples:

    ```mlir
    %e0 = etensor.event(%n) count 4 : !etensor.event<?>
    %e1 = etensor.event(%n) count %k : !etensor.event<?x8>
    %e2 = etensor.event(%experts) count from %counts : memref<?xi32>
        : !etensor.event<?>
    %e3 = etensor.event(%ranks, %tiles) count %ranks ranked
        : !etensor.event<?x?>
    ```
  }];
  let arguments = (ins Variadic<Index>:$sizes,
                       OptionalAttr<I64Attr>:$static_wait_count,
                       Optional<Index>:$wait_count,
                       Optional<AnyMemRef>:$wait_count_table,
                       UnitAttr:$ranked,
                       OptionalAttr<StrAttr>:$name);
  let results = (outs ETensor_EventType:$event);
  let assemblyFormat = [{
    `(` $sizes `)` `count`
    custom<WaitCount>($static_wait_count, $wait_count, $wait_count_table,
                      type($wait_count_table))
    (`ranked` $ranked^)?
    attr-dict `:` qualified(type($event))
  }];
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    EventType getEventType() { return ::llvm::cast<EventType>(getType()); }
    /// The size of dimension `dim`: a constant or the matching size operand.
    ::mlir::OpFoldResult getMixedSize(unsigned dim);
    /// A printable name for diagnostics: the `name` attribute or `<unnamed>`.
    ::llvm::StringRef getDisplayName();
  }];
}

def ETensor_TaskOp : ETensor_Op<"task", [
    AttrSizedOperandSegments, HasParent<"GraphOp">,
    DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "Run a device function over a task grid, wired by events";
  let description = [{
    Launches the device function `callee` once per point of the task grid
    (each point is a *task instance*; static extents are integers, symbolic
    extents are `index` values). The callee is a `func.func` whose arguments
    are the grid coordinates (`index`, one per grid dimension) followed by
    the values listed in `args` (buffers, or `index` values of the graph),
    with the same types. Its body runs on one CTA.

    `rank(%r)` names the `index` value that holds the rank (GPU) running
    the graph when several do; the edge maps may then take one symbol,
    bound to it: `(i)[r] -> (r, i)`. An in-edge on a `ranked` event must
    address dimension 0 with that symbol (a rank waits on its own copy).

    `ins` lists the events an instance waits on before it starts, `outs` the
    events it notifies when done. Each edge carries an affine map from the
    task grid (its dimensions) to the event's coordinates (its results): the
    map's dimension count must equal the grid rank and its result count the
    event rank. Instance `(i, j)` with out-edge `(i, j) -> (i)` adds one to
    counter `i` when it finishes.

    `triggered_by(%e, %indptr)` is a *data-dependent trigger* (the paper's
    MoE `exp_indptr`): a 1-D task grid whose instances
    `[indptr[c], indptr[c+1])` wait on coordinate `c` of the 1-D event `%e`.
    `indptr` (`C + 1` entries for an event of `C` coordinates) is computed
    at run time, so the instance-to-event mapping is not known when
    compiling; it must be final before any coordinate of `%e` completes.
    The grid extent is a bound known at launch: instances at or past
    `indptr[C]` do not run. A triggered task's device function takes the
    instance and its trigger coordinate `(i, c)`, and its edge maps have
    those two dimensions, so an out-edge `(i, c) -> (c)` notifies a
    coordinate chosen by the data (its event needs a table wait count).

    `guarded_indptr` (a triggered task only) asserts that the in-edges order
    every write of `indptr` before the instance: once they are satisfied the
    table is final (the Python front end sets it when it can prove that from
    the edges). The static schedule then reads the table once per CTA into
    registers instead of twice per instance from memory.

    `ticketed` changes how the static schedule deals the task: a CTA's
    queue entry for it runs the next instance nobody has claimed yet (a
    ticket drawn from a counter) instead of a fixed one, so the instances go
    to the CTAs that are free first, whatever each instance's duration. The
    task's instances must not wait on each other. The dynamic schedule,
    which deals by readiness anyway, ignores it.

    `pooled` deals the task at run time instead, phase by phase: a CTA's
    queue entry for it names one *pool* (all the instances whose grid
    coordinate `pool_dim` has one value, or every instance without
    `pool_dim`) and runs instances drawn from that pool's counter until the
    pool is empty, so a CTA runs as many of them as it is free for. Not with
    `ticketed` or a data-dependent trigger; the dynamic schedule ignores it.

    `prefetch = @fn` names a function with the callee's signature that an
    instance runs *before* its waits, on every thread of its CTA: it may
    only read what no task of the graph writes (weights), so it can start
    loading them (an L2 prefetch, a `cp.async` into shared memory) while the
    instance's producers finish. Waiting then overlaps the load.

    `prefetch_after = n` runs the prefetch after the task's first `n`
    in-edge waits instead (static schedule; the dynamic one runs an instance
    once all its waits are met), so it may also read what those waits'
    producers wrote: a routing table that names the weights to load, read
    while the later waits (the activations) are still pending. Not with a
    data-dependent trigger.

    `shared_region = r` (default 0) places the shared memory of the task's
    functions apart from that of tasks in other regions. Under the static
    schedule a CTA runs the prefetch of its next queue entry *ahead*, before
    the waits of the current one, when the two are in different regions: the
    next tile's weights stream in while the current instance waits and runs
    (the entry then skips its own prefetch). Same-region neighbours, which
    share memory, prefetch as usual.

    Example:

    ```mlir
    etensor.task @partial_sum grid [%n, 4]
        args(%A, %B : memref<?x256xf32>, memref<?x4xf32>)
        outs(%e[(i, j) -> (i)] : !etensor.event<?>) {name = "partial"}
    etensor.task @expert_gemm grid [%tiles]
        args(%X : memref<?x2048xbf16>)
        outs(%done[(i, c) -> (c)] : !etensor.event<?>)
        triggered_by(%ready, %indptr : !etensor.event<?>, memref<?xi32>)
    etensor.task @expert_down grid [%tiles]
        args(%X : memref<?x2048xbf16>)
        ins(%planned[(i, c) -> (0)] : !etensor.event<1>)
        triggered_by(%ready, %indptr : !etensor.event<?>, memref<?xi32>)
        {guarded_indptr}
    etensor.task @reduce grid [%tiles] rank(%rank)
        args(%rank, %partials : index, memref<?x?xbf16>)
        ins(%rs[(i)[r] -> (r, i)] : !etensor.event<?x?>)
    etensor.task @lm_head grid [%rows, %cols] args(%W : memref<?x2048xbf16>)
        {pooled, pool_dim = 0 : i64}
    etensor.task @gate_up grid [%cols] args(%W : memref<?x2048xbf16>)
        {prefetch = @gate_up__prefetch, shared_region = 1}
    etensor.task @slot_down grid [%slots, 32] args(%ids : memref<?x8xi32>)
        ins(%routed[(s, j) -> (0)] : !etensor.event<1>,
            %h[(s, j) -> (s)] : !etensor.event<?>)
        {prefetch = @slot_down__prefetch, prefetch_after = 1}
    ```
  }];
  let arguments = (ins FlatSymbolRefAttr:$callee,
                       Variadic<Index>:$dynamic_grid,
                       DenseI64ArrayAttr:$static_grid,
                       Optional<Index>:$rank,
                       Variadic<AnyTypeOf<[AnyMemRef, Index]>>:$args,
                       Variadic<ETensor_AnyEvent>:$in_events,
                       AffineMapArrayAttr:$in_maps,
                       Variadic<ETensor_AnyEvent>:$out_events,
                       AffineMapArrayAttr:$out_maps,
                       Optional<ETensor_AnyEvent>:$trigger_event,
                       Optional<MemRefRankOf<[AnySignlessInteger], [1]>>:$trigger_indptr,
                       UnitAttr:$guarded_indptr,
                       UnitAttr:$ticketed,
                       UnitAttr:$pooled,
                       OptionalAttr<ConfinedAttr<I64Attr, [IntNonNegative]>>:$pool_dim,
                       OptionalAttr<FlatSymbolRefAttr>:$prefetch,
                       OptionalAttr<ConfinedAttr<I64Attr, [IntPositive]>>:$prefetch_after,
                       OptionalAttr<ConfinedAttr<I64Attr, [IntNonNegative]>>:$shared_region,
                       OptionalAttr<StrAttr>:$name);
  let assemblyFormat = [{
    $callee `grid` custom<DynamicIndexList>($dynamic_grid, $static_grid)
    (`rank` `(` $rank^ `)`)?
    (`args` `(` $args^ `:` type($args) `)`)?
    custom<Edges>($in_events, type($in_events), $in_maps,
                  $out_events, type($out_events), $out_maps)
    (`triggered_by` `(` $trigger_event^ `,` $trigger_indptr `:`
        qualified(type($trigger_event)) `,` type($trigger_indptr) `)`)?
    attr-dict
  }];
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    int64_t getGridRank() { return getStaticGrid().size(); }
    /// Coordinates the device function and the edge maps take: the grid
    /// coordinates, plus the trigger coordinate of a data-dependent trigger.
    int64_t getCoordinateCount() {
      return getGridRank() + (getTriggerEvent() ? 1 : 0);
    }
    /// The extent of grid dimension `dim`: a constant or an `index` value.
    ::mlir::OpFoldResult getMixedExtent(unsigned dim);
    ::llvm::SmallVector<::mlir::OpFoldResult> getMixedGrid();
    /// A printable name for diagnostics: the `name` attribute or the callee.
    ::llvm::StringRef getDisplayName();
  }];
}

//===----------------------------------------------------------------------===//
// Schedule level
//===----------------------------------------------------------------------===//

def ETensor_WaitOp : ETensor_Op<"wait"> {
  let summary = "Block the CTA until an event coordinate reaches its count";
  let description = [{
    Waits until the counter at `indices` of `event` has received its wait
    count of notifications. Lowered to one thread polling the counter with
    `ld.acquire.gpu` (`.sys` on a `ranked` event, whose producers run on
    other GPUs) and `nanosleep` backoff, then a CTA barrier, so every
    thread of the CTA observes the producers' writes. The poll is bounded
    by a watchdog: on expiry the kernel records the event, coordinate and
    counter value and all CTAs exit.

    Example:

    ```mlir
    etensor.wait %e[%i] : !etensor.event<?>
    ```
  }];
  let arguments = (ins ETensor_AnyEvent:$event, Variadic<Index>:$indices);
  let assemblyFormat = [{
    $event `[` $indices `]` attr-dict `:` qualified(type($event))
  }];
  let hasVerifier = 1;
}

def ETensor_NotifyOp : ETensor_Op<"notify"> {
  let summary = "Signal one notification on an event coordinate";
  let description = [{
    Adds one to the counter at `indices` of `event`, after every thread of
    the CTA has finished the task body: a CTA barrier, then one thread does
    a release atomic add at GPU scope. On a `ranked` event, coordinate 0
    picks the rank whose copy is notified, and the atomic is a system-scope
    release on that rank's memory (peer access over NVLink/PCIe).

    With a result, the op also returns whether this notification was the
    one that completed the coordinate (the counter reached its wait count);
    dynamic scheduling uses it to push the consumers that became ready.

    Example:

    ```mlir
    etensor.notify %e[%i] : !etensor.event<?>
    %done = etensor.notify %e[%i] : !etensor.event<?> -> i1
    ```
  }];
  let arguments = (ins ETensor_AnyEvent:$event, Variadic<Index>:$indices);
  let results = (outs Optional<I1>:$completed);
  let assemblyFormat = [{
    $event `[` $indices `]` attr-dict `:` qualified(type($event))
    (`->` type($completed)^)?
  }];
  let hasVerifier = 1;
}

def ETensor_QueueOp : ETensor_Op<"queue", [MemoryEffects<[MemAlloc]>]> {
  let summary = "Declare the ready-task queue of dynamic scheduling";
  let description = [{
    Declares a multi-producer multi-consumer ring of task descriptors in
    global memory with `capacity` slots. The capacity is computed from the
    graph and the concrete shapes (at most every task instance is ready at
    once).

    Example:

    ```mlir
    %q = etensor.queue capacity %total : !etensor.queue
    ```
  }];
  let arguments = (ins Index:$capacity);
  let results = (outs ETensor_QueueType:$queue);
  let assemblyFormat = [{
    `capacity` $capacity attr-dict `:` qualified(type($queue))
  }];
}

def ETensor_PushOp : ETensor_Op<"push"> {
  let summary = "Push ready task instances onto a queue";
  let description = [{
    Pushes `count` (default one) consecutive instances of task `task`,
    starting at linear instance index `instance`, onto the queue. A push
    claims slots with an atomic on the tail, writes the descriptors, then
    sets each slot's ready flag with release semantics. A push beyond the
    capacity is reported through the watchdog word, never written.

    A range push is how a data-dependent trigger fires: when coordinate `c`
    completes, instances `[indptr[c], indptr[c+1])` become ready.

    Example:

    ```mlir
    etensor.push %q[1, %i] : !etensor.queue
    etensor.push %q[2, %begin] count %n : !etensor.queue
    ```
  }];
  let arguments = (ins ETensor_QueueType:$queue, I64Attr:$task,
                       Index:$instance, Optional<Index>:$count);
  let assemblyFormat = [{
    $queue `[` $task `,` $instance `]` (`count` $count^)? attr-dict `:`
    qualified(type($queue))
  }];
  let hasVerifier = 1;
}

def ETensor_RetireOp : ETensor_Op<"retire"> {
  let summary = "Declare queued task instances that will never be pushed";
  let description = [{
    Lowers the queue's termination count by `count`: those instances of a
    data-dependent trigger's bound grid (at or past `indptr[C]`) will never
    be pushed, so workers must not wait for them. The dynamic schedule
    retires them when the last coordinate of the trigger event fires. Lowered
    to one atomic add on the queue's `retired` header word, which every
    worker's pop reads.

    Example:

    ```mlir
    etensor.retire %q count %unused : !etensor.queue
    ```
  }];
  let arguments = (ins ETensor_QueueType:$queue, Index:$count);
  let assemblyFormat = [{
    $queue `count` $count attr-dict `:` qualified(type($queue))
  }];
}

def ETensor_CheckRangeOp : ETensor_Op<"check_range"> {
  let summary = "Check one range of a data-dependent trigger's table";
  let description = [{
    Range `coordinate` of task `task`'s trigger table, `[begin, end) =
    [indptr[c], indptr[c+1])`, must lie inside the task's 1-D grid of
    `bound` instances: `begin <= end <= bound`, and `begin == 0` for
    coordinate 0. Returns true when it does. Otherwise it records a bad
    trigger range (the task, the coordinate, `begin` and `end`) in the
    kernel's status words, unless a failure is already recorded, and
    returns false; every CTA then stops as after a watchdog expiry, and the
    runtime raises `etc.TriggerRangeError`. The dynamic schedule checks each
    range before pushing it, so a bad table never pushes an instance outside
    the grid nor leaves one past it unrun.

    Example:

    ```mlir
    %ok = etensor.check_range %begin, %end of task 2 at %c bound %n
    %count = arith.select %ok, %size, %zero : index
    etensor.push %q[2, %begin] count %count : !etensor.queue
    ```
  }];
  let arguments = (ins Index:$begin, Index:$end, I64Attr:$task,
                       Index:$coordinate, Index:$bound);
  let results = (outs I1:$ok);
  let assemblyFormat = [{
    $begin `,` $end `of` `task` $task `at` $coordinate `bound` $bound
    attr-dict
  }];
}

def ETensor_PopOp : ETensor_Op<"pop"> {
  let summary = "Take the next ready task instance from a queue";
  let description = [{
    Blocks until a ready descriptor is available or every task instance of
    the megakernel has completed. `valid` is false in the second case (the
    worker exits); otherwise `task` is the task index and `instance` the
    linear instance index. One thread pops, the CTA barrier broadcasts the
    descriptor to the others. The poll is bounded by the watchdog.

    Example:

    ```mlir
    %valid, %task, %instance = etensor.pop %q : !etensor.queue
    ```
  }];
  let arguments = (ins ETensor_QueueType:$queue);
  let results = (outs I1:$valid, Index:$task, Index:$instance);
  let assemblyFormat = "$queue attr-dict `:` qualified(type($queue))";
}

def ETensor_WorkerOp : ETensor_Op<"worker", [
    HasParent<"GraphOp">, NoTerminator, SingleBlock]> {
  let summary = "The per-CTA loop of a persistent megakernel";
  let description = [{
    Every CTA of the persistent kernel runs this loop: obtain the next task
    instance, run the `etensor.dispatch` region of its task with the
    instance's grid coordinates, repeat until no work is left.

    - `static`: the instances come from a per-CTA queue precomputed at
      launch (round-robin over a topological order of the task grid, built
      by the runtime from the concrete shapes and cached per shape).
    - `dynamic(%q)`: the instances are popped from the on-GPU ready queue
      `%q`; dispatch regions push the consumers they make ready.

    The body holds one `etensor.dispatch` per task, in task-index order.

    Example:

    ```mlir
    etensor.worker static {
      etensor.dispatch 0 grid [%n, 4] {
      ^bb0(%i: index, %j: index):
        func.call @partial_sum(%i, %j, %A, %B)
            : (index, index, memref<?x256xf32>, memref<?x4xf32>) -> ()
        etensor.notify %e[%i] : !etensor.event<?>
      }
    }
    ```
  }];
  let arguments = (ins ETensor_ScheduleKind:$schedule,
                       Optional<ETensor_QueueType>:$queue);
  let regions = (region SizedRegion<1>:$body);
  let assemblyFormat = [{
    $schedule (`(` $queue^ `:` qualified(type($queue)) `)`)?
    attr-dict-with-keyword $body
  }];
  let hasVerifier = 1;
}

def ETensor_DispatchOp : ETensor_Op<"dispatch", [
    AttrSizedOperandSegments, HasParent<"WorkerOp">,
    SingleBlockImplicitTerminator<"YieldOp">]> {
  let summary = "Run one instance of one task inside a worker";
  let description = [{
    The body of task number `task` (its index in the graph), run for one
    instance. The entry block's `index` arguments are the instance's grid
    coordinates; the grid extents are the op's operands and constants, so
    the worker can turn a linear instance index into coordinates.

    With `triggered_by(%e, %indptr)` (a data-dependent trigger, 1-D grid)
    the block has a second argument, the trigger coordinate `c` with
    `indptr[c] <= i < indptr[c+1]`, which the lowering finds by binary
    search. Under the static schedule the lowering first waits until every
    coordinate of `%e` is complete, and instances at or past `indptr[C]`
    skip the body and its notifications; under the dynamic schedule only
    the pushed instances `[indptr[c], indptr[c+1])` are ever dispatched.

    `shared_region` and `guarded_indptr` are the task's (`etensor.task`):
    the static lowering runs the prefetch of the CTA's next entry ahead when
    its region differs, and keeps a guarded trigger table in registers.
    `ticket(%t)` (a `ticketed` task under the static schedule) names the
    one-counter event whose counter hands out the instances: a queue entry
    runs the instance it draws, not the one it names. `pool(%p)` (a `pooled`
    task under the static schedule) names the event with one counter per
    pool (per value of grid coordinate `pool_dim`, or one): a queue entry's
    instance field is the pool's index, and the entry runs the pool's
    instances it draws until none is left.

    Example:

    ```mlir
    etensor.dispatch 1 grid [%n] {
    ^bb0(%i: index):
      etensor.wait %e[%i] : !etensor.event<?>
      func.call @final_sum(%i, %B, %C)
          : (index, memref<?x4xf32>, memref<?xf32>) -> ()
    }
    etensor.dispatch 2 grid [%tiles]
        triggered_by(%ready, %indptr : !etensor.event<?>, memref<?xi32>)
        ticket(%tickets : !etensor.event<1>) {
    ^bb0(%i: index, %c: index):
      func.call @expert_gemm(%i, %c, %X)
          : (index, index, memref<?x2048xbf16>) -> ()
    }
    etensor.dispatch 3 grid [%layers, 64] pool(%pools : !etensor.event<?>)
        attributes {pool_dim = 0 : i64} {
    ^bb0(%l: index, %j: index):
      func.call @lm_head(%l, %j, %W) : (index, index, memref<?x2048xbf16>) -> ()
    }
    ```
  }];
  let arguments = (ins I64Attr:$task, Variadic<Index>:$dynamic_grid,
                       DenseI64ArrayAttr:$static_grid,
                       Optional<ETensor_AnyEvent>:$trigger_event,
                       Optional<MemRefRankOf<[AnySignlessInteger], [1]>>:$trigger_indptr,
                       Optional<ETensor_AnyEvent>:$ticket,
                       Optional<ETensor_AnyEvent>:$pool,
                       OptionalAttr<ConfinedAttr<I64Attr, [IntNonNegative]>>:$pool_dim,
                       OptionalAttr<ConfinedAttr<I64Attr, [IntNonNegative]>>:$shared_region,
                       UnitAttr:$guarded_indptr);
  let regions = (region SizedRegion<1>:$body);
  let assemblyFormat = [{
    $task `grid` custom<DynamicIndexList>($dynamic_grid, $static_grid)
    (`triggered_by` `(` $trigger_event^ `,` $trigger_indptr `:`
        qualified(type($trigger_event)) `,` type($trigger_indptr) `)`)?
    (`ticket` `(` $ticket^ `:` qualified(type($ticket)) `)`)?
    (`pool` `(` $pool^ `:` qualified(type($pool)) `)`)?
    attr-dict-with-keyword $body
  }];
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    ::llvm::SmallVector<::mlir::OpFoldResult> getMixedGrid();
  }];
}

def ETensor_YieldOp : ETensor_Op<"yield", [
    Pure, ReturnLike, Terminator, HasParent<"DispatchOp">]> {
  let summary = "End of a dispatch body";
  let description = [{
    Terminates an `etensor.dispatch` body; implicit in the custom syntax.

    Example:

    ```mlir
    etensor.yield
    ```
  }];
  let assemblyFormat = "attr-dict";
}

#endif // ETC_DIALECT_ETENSOR_IR_ETENSOROPS_TD
