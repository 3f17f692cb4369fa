//===- Passes.td - ETC conversion passes -------------------*- tablegen -*-===//
//
// Part of ETC, the Event Tensor Compiler.
//
//===----------------------------------------------------------------------===//

#ifndef ETC_CONVERSION_PASSES_TD
#define ETC_CONVERSION_PASSES_TD

include "mlir/Pass/PassBase.td"

//===----------------------------------------------------------------------===//
// ETensorToGPU
//===----------------------------------------------------------------------===//

def ConvertETensorToGPU : Pass<"convert-etensor-to-gpu", "::mlir::ModuleOp"> {
  let summary = "Lower scheduled etensor graphs to one persistent gpu.func";
  let description = [{
    Turns every scheduled `etensor.graph` into a `gpu.module` holding one
    persistent kernel `gpu.func` with the graph's name, plus the device
    functions it calls. The kernel ABI is, in order: the graph's arguments
    (`index` symbols, then memref buffers in the graph's order), then
    `%counters: memref<?xi32>` (all event tensors, concatenated in
    declaration order, then one "done" counter; all zero when a launch
    starts: the last CTA to finish zeroes them for the next launch, so the
    host resets nothing), `%queue: memref<?xi64>` (the static per-CTA
    queues: `gridDim.x + 1` offsets then entries
    `task << 48 | linear_instance`; with `record-sm`, then `gridDim.x`
    words in which each CTA writes the `%smid` it ran on as it exits, for
    the runtime to deal later launches by SM; with `sm-slices`, one by-SM
    word), `%status: memref<?xi32>` (the failure
    record: written only on failure, cleared by the host after reading it)
    and `%max_polls: index` (the watchdog bound).

    - `etensor.notify`: CTA barrier, then thread 0 does
      `red.release.gpu.global.add.u32`.
    - `etensor.wait`: thread 0 polls with `ld.acquire.gpu.global.u32` and
      `nanosleep` backoff until the counter reaches the coordinate's wait
      count, then a CTA barrier. The poll gives up after `watchdog-polls`
      polls: it records `[1, event id, task id, counter, wait count,
      coordinates...]` in `%status` and sets the abort flag that makes
      every CTA leave its worker loop.
    - Device functions are cloned into the kernel module (the pipeline
      inlines them) with every `memref.global` they read: a global in
      `#gpu.address_space<workgroup>` is how a tile gets shared memory. A
      `memref.alloca` outside the default or private memory space is
      rejected, since NVPTX cannot lower it.

    #### Input invariant
    Graphs scheduled by `etensor-static-schedule`.

    #### Output IR
    A `gpu.module` per graph (with `gpu.container_module` on the module),
    no etensor ops. Run `gpu-lower-to-nvvm-pipeline` or the registered
    `etc-static-to-ptx` pipeline next.
  }];
  let options = [
    Option<"watchdogPolls", "watchdog-polls", "int64_t", /*default=*/"20000000",
           "Polls of one wait before the watchdog fires (about 2^24 polls "
           "at up to 1 us of backoff each, i.e. tens of seconds).">,
    Option<"blockSize", "block-size", "int64_t", /*default=*/"256",
           "Threads per CTA when the graph has no `etensor.block_size`.">,
    Option<"minCtasPerSM", "min-ctas-per-sm", "int64_t", /*default=*/"0",
           "Ask for this many resident CTAs per SM (`nvvm.minctasm`: ptxas "
           "caps registers at 65536 / (threads x N), spilling if it must). "
           "Every tile is inlined into one kernel, which gets the register "
           "count of its hungriest tile; 0 leaves it to ptxas.">,
    Option<"maxPopChunk", "max-pop-chunk", "int64_t", /*default=*/"8",
           "Dynamic schedule: most queue positions a CTA claims per head "
           "request when many instances are ready at start (the kernel takes "
           "min(this, ready / (4 x CTAs)), at least 1). Chunks save head "
           "atomics on short tasks; 1 keeps the CTAs on consecutive "
           "instances (the static schedule's order), which GEMM tiles that "
           "share operands through L2 prefer.">,
    Option<"prefetchNext", "prefetch-next", "bool", /*default=*/"false",
           "Static schedule: before an instance's waits, call the prefetch "
           "function of the CTA's next queue entry (when that task has one "
           "and no trigger), so the next tile's operands load while this "
           "one runs. The entry's own call still happens at its start.">,
    Option<"smSlices", "sm-slices", "bool", /*default=*/"false",
           "Static schedule: each CTA takes its queue slice by the SM it runs "
           "on when the runtime dealt the queue so (the queue's last word is "
           "then `S << 8 | occ`: the k-th CTA to start on SM s takes slice "
           "`k * S + s`, when `%nsmid` is S and the grid S * occ; else, and "
           "when the word is 0, slice `%ctaid.x`). Thread 0 counts its SM's "
           "CTAs on a word after the done counter and hands the slice to the "
           "CTA through a `.shared` word. Off, the kernel reads no such word. "
           "Code before the static loop may change ptxas's register "
           "allocation of an inlined kernel: meant for kernels whose tiles "
           "are called (`outline`).">,
    Option<"recordSM", "record-sm", "bool", /*default=*/"false",
           "Static schedule: each CTA writes the `%smid` it ran on into the "
           "queue's last `gridDim.x` words as it exits, for the runtime to "
           "deal later launches by SM (etc.compile(sm_deal=...)). At the "
           "exit, not the start: code before the loop changes ptxas's "
           "register allocation of an inlined kernel most.">,
    Option<"queueAhead", "queue-ahead", "bool", /*default=*/"false",
           "Static schedule: each CTA loads its next queue entry as its "
           "current instance starts, so the load's round trip overlaps the "
           "instance instead of preceding the next one (one i64 more carried "
           "by the CTA's loop).">,
    Option<"waitMemo", "wait-memo", "bool", /*default=*/"false",
           "Static schedule: each CTA remembers the coordinate of the last "
           "wait it saw complete (event and coordinate, one i64 carried by "
           "its loop) and skips a wait on that same coordinate, poll and "
           "join: counters only grow within a launch, and a coordinate's "
           "wait count is the same for every waiter. Consecutive instances "
           "of a stage on one CTA then wait once.">,
    Option<"convergentReductions", "convergent-reductions", "bool",
           /*default=*/"false",
           "The scheduler's CTA reductions (or, and, popc) in kernels with "
           "aligned barriers as nvvm.barrier with a reduction, which LLVM "
           "sees as a convergent call, instead of inline `bar.red` asm, "
           "which it does not. Kernels that draw (non-aligned barriers) "
           "keep their inline `barrier.red`: NVVM has no non-aligned op.">,
    Option<"popAhead", "pop-ahead", "bool", /*default=*/"true",
           "Dynamic schedule: request a CTA's next queue positions when it "
           "takes its current one, so the request's latency overlaps the "
           "task; the position is then held while the task runs, and an "
           "instance pushed into it waits for that task. false requests "
           "positions only when the CTA is free.">,
    ListOption<"outline", "outline", "std::string",
               "Device functions the kernel calls instead of inlining (their "
               "calls get `no_inline`; `*` names them all). Each called "
               "function gets its own register allocation from ptxas, so one "
               "tile's register pressure does not spill another's; a call "
               "passes the tile's arguments through the parameter space.">,
    Option<"checkTableCounts", "check-table-counts", "bool",
           /*default=*/"true",
           "As the launch ends, the last CTA checks every coordinate of each "
           "event whose wait counts come from a table: more notifications "
           "than the count means its waiters were released before its last "
           "producers finished (a count too low), recorded as state 5 "
           "(etc.WaitCountError). The check is a function per such event "
           "that the kernel calls (no_inline: inlined at the exit, it moved "
           "ptxas's allocation of the whole kernel); graphs without such "
           "events get no code.">,
    Option<"trace", "trace", "bool", /*default=*/"false",
           "Record every task instance's start and end (%globaltimer), SM and "
           "CTA in a trace buffer passed as one more kernel parameter "
           "(`memref<?xi64>`: word 0 counts records, 4 words per record). "
           "Off, the kernel has no tracing code.">,
  ];
  let dependentDialects = [
    "::mlir::arith::ArithDialect", "::mlir::func::FuncDialect",
    "::mlir::gpu::GPUDialect", "::mlir::LLVM::LLVMDialect",
    "::mlir::memref::MemRefDialect", "::mlir::NVVM::NVVMDialect",
    "::mlir::scf::SCFDialect",
  ];
}

#endif // ETC_CONVERSION_PASSES_TD
