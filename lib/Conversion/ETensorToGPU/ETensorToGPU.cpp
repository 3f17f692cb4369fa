//===- ETensorToGPU.cpp - Scheduled etensor graphs to a gpu.func ----------===//
//
// Part of ETC, the Event Tensor Compiler.
//
// One persistent kernel per graph. Synchronisation is written as inline PTX
// so the exact memory-model instructions (ld.acquire.gpu, red.release.gpu,
// bar.red.or) are what the hardware runs, independent of how LLVM would
// lower atomics with orderings.
//
//===----------------------------------------------------------------------===//

#include "etc/Conversion/ETensorToGPU/ETensorToGPU.h"
#include "etc/Dialect/ETensor/IR/ETensorOps.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Utils/StaticValueUtils.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/IR/ImplicitLocOpBuilder.h"
#include "mlir/IR/Matchers.h"
#include "mlir/IR/SymbolTable.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"
#include "mlir/Transforms/RegionUtils.h"
#include "llvm/ADT/SetVector.h"
#include "llvm/ADT/SmallBitVector.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/StringSet.h"
#include <limits>
#include <map>
#include <optional>

namespace mlir::etensor {
#define GEN_PASS_DEF_CONVERTETENSORTOGPU
#include "etc/Conversion/Passes.h.inc"
} // namespace mlir::etensor

using namespace mlir;
using namespace mlir::etensor;

namespace {

/// Status record layout (i32 words), read by the runtime after a launch. The
/// kernel only writes it on failure, so a failure stays recorded (and makes
/// later launches fail fast) until the host reads and clears it.
enum StatusWord : int64_t {
  kState = 0,      // 0 ok, 1 watchdog expired, 2 bad task descriptor
  kEventId = 1,    // declaration index of the stuck event
  kTaskId = 2,     // task index of the waiting dispatch
  kCounter = 3,    // counter value seen last
  kWaitCount = 4,  // the count it waited for
  kInstance = 5,   // linear instance index of the waiting task
  kBlock = 6,      // CTA that gave up
  kCoordinate = 7, // linear coordinate in the stuck event
  kNumStatusWords = 8
};
// A wait or a pop that gave up (kEventId -1: a queue position never filled;
// -2: the rank barrier).
constexpr int64_t kWatchdog = 1;
// A push past the queue's capacity (kCounter: the slot, kWaitCount: the
// capacity), beyond "ok" (0), "watchdog" (1) and "bad task" (2).
constexpr int64_t kQueueOverflow = 3;
// A trigger range outside the task's grid (kCoordinate: the range,
// kCounter/kWaitCount: its begin and end, kInstance: the instance that found
// no range, or -1).
constexpr int64_t kBadTrigger = 4;
// A coordinate of an event whose wait counts come from a table received more
// notifications than its count (kEventId, kCoordinate, kCounter: the
// notifications, kWaitCount: the count), seen as the launch ends.
constexpr int64_t kCountExceeded = 5;
// Queue layout (i64 words) of the dynamic schedule: pop index, push index,
// instances retired (a data-dependent trigger's unused bound), then the ring
// of pushed descriptors `(task + 1) << 48 | instance` (zero while a slot is
// empty).
constexpr int64_t kHead = 0, kTail = 1, kRetired = 2, kRing = 3;
constexpr int64_t kInstanceBits = 48;
// Range pushes of one notify/push section written by the whole CTA (three
// workgroup words each); more fall back to thread 0 alone.
constexpr int64_t kMaxRangePushes = 8;
// Fan-out loops of one notify/push section run by the whole CTA (a word
// saying the loop runs, then its live-in values, each an i64 word); more,
// or with more live-ins, stay on thread 0.
constexpr int64_t kMaxFanOuts = 2, kMaxFanOutLiveIns = 6;
constexpr int64_t kFanOutWords = 1 + kMaxFanOutLiveIns;
constexpr int64_t kMaxTasks = (int64_t(1) << (63 - kInstanceBits)) - 1;
// Poll backoff: nanosleep doubling from 16 ns to 256 ns. A longer cap saves
// memory traffic but adds up to the cap to every notify -> wait handoff.
constexpr int64_t kFirstSleepNs = 16, kMaxSleepNs = 256;
// Tiles' shared memory past this many bytes goes to dynamic shared memory;
// the kernel's own workgroup words need the rest of the 48 KiB static limit.
constexpr int64_t kStaticSharedBytes = 48 * 1024 - 1024;
// The most shared memory an sm_90 CTA can have (227 KiB), less the kernel's.
constexpr int64_t kMaxSharedBytes = 227 * 1024 - 1024;
// Ranked graphs: the rank barrier's words at the start of the counters.
constexpr int64_t kLaunchesWord = 0, kArrivalsWord = 1, kRankBarrierWords = 2;
// The dynamic worker's own workgroup words: globals marked as the kernel's,
// which overlayWorkgroupGlobals places after the tiles' buffers.
constexpr StringLiteral kBroadcastGlobal = "__etc_broadcast";
constexpr StringLiteral kPushRecordsGlobal = "__etc_push_records";
constexpr StringLiteral kKernelWordsAttrName = "etensor.kernel_words";
// llvm::Value::MaximumAlignment.
constexpr uint64_t kMaxLLVMAlignment = uint64_t(1) << 32;

/// Side-effect-free index arithmetic that a dispatch body computes its edge
/// coordinates with; every thread may evaluate it.
/// Pure index arithmetic (edge maps), the casts of a task's buffers to its
/// tile's parameter types and the call of its prefetch function: run by
/// every thread before the waits.
static bool isHoistable(Operation &op) {
  return (op.getNumRegions() == 0 &&
          isa<arith::ArithDialect>(op.getDialect()) && isPure(&op)) ||
         isa<memref::CastOp>(op) ||
         (isa<func::CallOp>(op) && op.hasAttr(kPrefetchAttrName));
}

/// What the kernel knows about one event tensor.
struct EventInfo {
  int64_t id;
  Value base;               // offset of coordinate 0 in %counters
  SmallVector<Value> sizes; // extents, in kernel values
  EventOp op;
  Value waitCount;     // index value, or null when read from a table
  Value table;         // the table, mapped into the kernel
  bool ranked = false; // notified from other ranks: system-scope atomics
};

class KernelBuilder {
public:
  KernelBuilder(GraphOp graph, gpu::GPUFuncOp kernel, int64_t numGraphArgs,
                bool ranked, bool trace)
      : graph(graph), kernel(kernel),
        b(graph.getLoc(), &kernel.getBody().front(),
          kernel.getBody().front().begin()) {
    Block &entry = kernel.getBody().front();
    for (int64_t i = 0; i < numGraphArgs; ++i)
      mapping.map(graph.getBodyBlock().getArgument(i), entry.getArgument(i));
    counters = entry.getArgument(numGraphArgs);
    queue = entry.getArgument(numGraphArgs + 1);
    status = entry.getArgument(numGraphArgs + 2);
    maxPolls = entry.getArgument(numGraphArgs + 3);
    if (ranked)
      peers = entry.getArgument(numGraphArgs + 4);
    if (trace)
      traceBuffer = entry.getArgument(numGraphArgs + (ranked ? 5 : 4));
    broadcast = kernel.getWorkgroupAttributions().empty()
                    ? kernelWords(kBroadcastGlobal)
                    : Value(kernel.getWorkgroupAttributions().front());
    pushRecords = kernelWords(kPushRecordsGlobal);
  }

  LogicalResult build();
  /// The kernel's workgroup words `name` (a global the pass declared), read
  /// at the kernel's entry; null when the kernel has none.
  Value kernelWords(StringRef name) {
    auto global = SymbolTable::lookupNearestSymbolFrom<memref::GlobalOp>(
        kernel, StringAttr::get(kernel.getContext(), name));
    if (!global)
      return Value();
    return memref::GetGlobalOp::create(b, global.getType(), name);
  }
  /// Dynamic schedule: most queue positions per head request.
  int64_t maxPopChunk = 8;
  /// Static schedule: call the next entry's prefetch function first.
  bool prefetchNext = false;
  /// Static schedule: take the queue slice by SM (staticSlice).
  bool smSlices = false;
  /// Static schedule: record each CTA's SM at its exit.
  bool recordSM = false;
  /// The scheduler's barriers in PTX's non-aligned forms (see ctaBarrier):
  /// set by build() when a dispatch is pooled or ticketed.
  bool nonAlignedBarriers = false;
  /// ctaReduce through nvvm.barrier (option convergent-reductions).
  bool convergentReductions = false;
  /// checkTableCounts at the exit (option check-table-counts).
  bool checkCounts = true;
  /// Static schedule: load the next queue entry as the current one starts.
  bool queueAhead = false;
  /// Static schedule: skip a wait on the coordinate the CTA's last
  /// completed wait saw (`waitSeen[memoIndex]`, an i64 key; see lowerWait).
  bool waitMemo = false;
  int memoIndex = -1;
  /// Static schedule, tasks in several shared regions: the prefetch of the
  /// next entry runs ahead when its region differs from the current one's.
  /// `prefetchedAhead`: whether the current entry's prefetch already ran.
  bool prefetchAhead = false;
  Value prefetchedAhead;
  /// Static loop: the CTA's next queue position and its slice's end.
  Value nextPosition, sliceEnd;
  /// Set by prefetchAheadOf: whether the next entry's prefetch ran.
  Value aheadRan;
  /// The dispatches of the static loop, for prefetchAheadOf.
  SmallVector<DispatchOp> staticDispatches;
  /// Static schedule: the coordinates that triggered tasks' in-edges wait on,
  /// when constant and of an event whose wait count is known at launch (no
  /// table). Counters only grow within a launch, so once thread 0 saw one
  /// complete, the CTA's later waits on it (any task's) skip the poll; the
  /// CTA still joins.
  /// `waitSeen[i]`: whether the CTA saw `cachedWaits[i]` complete, as the
  /// instance being lowered sees it (a loop-carried flag of the static loop).
  struct CachedWait {
    Value event;
    SmallVector<int64_t> coords;
  };
  SmallVector<CachedWait> cachedWaits;
  SmallVector<Value> waitSeen, loopSeen;
  /// Static schedule: the trigger tables of `guarded_indptr` tasks that a
  /// CTA keeps in registers, one entry per thread (`indptr[tid]`, or the
  /// largest index past the table), loaded by the first of the CTA's
  /// instances to need it: the in-edges made it final. `tableState` holds,
  /// per table, the entry then whether it was loaded, as the instance being
  /// lowered sees them (loop-carried like `waitSeen`).
  SmallVector<Value> cachedTables;
  SmallVector<Value> tableState, loopTableState;
  /// The kernel's threads per CTA (known when compiling).
  int64_t blockThreads = 0;
  /// Static schedule: the `ticketed` dispatches, and per dispatch the ticket
  /// thread 0 drew ahead for the CTA's next entry (-1: none), as the
  /// instance being lowered sees it (loop-carried).
  SmallVector<DispatchOp> ticketed;
  SmallVector<Value> ticketState, loopTicketState;
  /// Dynamic schedule: request the next chunk of positions when taking the
  /// current one, not when the CTA is free.
  bool popAhead = true;

private:
  Value index(int64_t v) { return arith::ConstantIndexOp::create(b, v); }
  Value i32(int64_t v) { return arith::ConstantIntOp::create(b, v, 32); }
  Value i64(int64_t v) { return arith::ConstantIntOp::create(b, v, 64); }
  Value toI64(Value v) {
    return arith::IndexCastOp::create(b, b.getI64Type(), v);
  }
  Value toI32(Value v) {
    if (v.getType().isIndex())
      return arith::IndexCastOp::create(b, b.getI32Type(), v);
    return v;
  }
  /// Generic address of counter word `offset` of rank `rank`'s copy of the
  /// counters (every rank lays them out alike).
  Value peerCounterAddress(Value rank, Value offset) {
    Value base = memref::LoadOp::create(b, peers, ValueRange{rank});
    return arith::AddIOp::create(
        b, base, arith::MulIOp::create(b, toI64(offset), i64(4)));
  }
  /// Where a notification of `coords` goes: this rank's counters, or for a
  /// ranked event, those of rank coords[0]. Returns the PTX scope too.
  std::pair<Value, StringRef> notifyAddress(EventInfo &info,
                                            ArrayRef<Value> coords) {
    Value offset =
        arith::AddIOp::create(b, info.base, linearize(coords, info.sizes));
    if (info.ranked)
      return {peerCounterAddress(coords[0], offset), "sys"};
    return {addressOf(counters, offset), "gpu"};
  }
  Value waitForAllRanks();
  /// Generic address of element `offset` of an i32 buffer.
  Value addressOf(Value buffer, Value offset) {
    Value base =
        toI64(memref::ExtractAlignedPointerAsIndexOp::create(b, buffer));
    return arith::AddIOp::create(
        b, base, arith::MulIOp::create(b, toI64(offset), i64(4)));
  }
  /// Volatile inline PTX with one `result` (or none when null).
  LLVM::InlineAsmOp inlineAsm(Type result, StringRef text,
                              StringRef constraints, ValueRange operands) {
    return LLVM::InlineAsmOp::create(
        b, result ? TypeRange(result) : TypeRange(), operands, text,
        constraints, /*has_side_effects=*/true, /*is_align_stack=*/false,
        LLVM::tailcallkind::TailCallKind::None, LLVM::AsmDialectAttr(),
        ArrayAttr());
  }
  Value asm32(StringRef text, StringRef constraints, ValueRange operands) {
    return inlineAsm(b.getI32Type(), text, constraints, operands).getResult(0);
  }
  Value asm64(StringRef text, StringRef constraints, ValueRange operands) {
    return inlineAsm(b.getI64Type(), text, constraints, operands).getResult(0);
  }
  void asmVoid(StringRef text, StringRef constraints, ValueRange operands) {
    inlineAsm(Type(), text, constraints, operands);
  }
  Value isThreadZero() {
    Value tid = gpu::ThreadIdOp::create(b, gpu::Dimension::x);
    return arith::CmpIOp::create(b, arith::CmpIPredicate::eq, tid, index(0));
  }
  /// Joins the CTA at barrier 0: `gpu.barrier` (PTX's aligned `bar.sync`),
  /// or in a kernel that draws (a pool or a ticket) the non-aligned
  /// `barrier.sync` through the convergent intrinsic. Such a kernel's loop
  /// carries thread 0's draws ahead (-1 on the other threads), and LLVM
  /// restructures that loop (it peels an unwaited pool's) so that lane 0
  /// and the other lanes of a warp reach different copies of one barrier:
  /// the aligned form leaves that undefined; a pooled kernel hung and a
  /// ticketed one stopped at an illegal instruction (compute-sanitizer:
  /// divergent threads at a `BAR.RED`). Other kernels keep the aligned
  /// form, which ptxas allocates better for (a MoE tile spilled with the
  /// other).
  void ctaBarrier() {
    if (!nonAlignedBarriers) {
      gpu::BarrierOp::create(b);
      return;
    }
    LLVM::CallIntrinsicOp::create(
        b, b.getStringAttr("llvm.nvvm.barrier.cta.sync.all"),
        ValueRange{i32(0)});
  }
  /// Joins the CTA reducing `pred` (i32, nonzero: true) with `bar.red`, or
  /// `barrier.red` where ctaBarrier is non-aligned: `op` "or" or "and"
  /// gives 1 or 0, "popc" the count of threads whose `pred` holds. With
  /// convergentReductions the aligned form is nvvm.barrier's reduction:
  /// inline asm is not convergent to LLVM, which may then sink or duplicate
  /// it into divergent code; the intrinsic call is.
  Value ctaReduce(StringRef op, Value pred) {
    if (convergentReductions && !nonAlignedBarriers) {
      auto kind = op == "or"    ? NVVM::BarrierReduction::OR
                  : op == "and" ? NVVM::BarrierReduction::AND
                                : NVVM::BarrierReduction::POPC;
      return NVVM::BarrierOp::create(
                 b, b.getI32Type(), /*barrierId=*/Value(),
                 /*numberOfThreads=*/Value(),
                 NVVM::BarrierReductionAttr::get(b.getContext(), kind), pred)
          .getRes();
    }
    std::string red =
        (Twine(nonAlignedBarriers ? "barrier.red." : "bar.red.") + op).str();
    std::string result = op == "popc"
                             ? red + ".u32 $0, 0, %p;"
                             : red + ".pred %p, 0, %p; selp.u32 $0, 1, 0, %p;";
    return asm32("{ .reg .pred %p; setp.ne.u32 %p, $1, 0; " + result + " }",
                 "=r,r", pred);
  }

  LogicalResult declareEvent(EventOp event);
  LogicalResult checkKernelOperands(Operation *root, bool nested = true);
  Value linearize(ValueRange coords, ArrayRef<Value> sizes);
  SmallVector<Value> delinearize(Value linear, ArrayRef<Value> extents);
  Value pollCounter(EventInfo &info, Value coordinate, Value target,
                    int64_t taskId, Value instance);
  Value noneFailed(Value failed);
  Value waitOnCoordinate(EventInfo &info, Value coordinate, Value target,
                         int64_t taskId, Value instance, Value seen = Value());
  std::optional<unsigned> cachedWaitIndex(WaitOp wait);
  void collectCachedWaits(ArrayRef<DispatchOp> dispatches);
  Value lowerWait(WaitOp wait, int64_t taskId, Value instance);
  Value waitForWholeEvent(Value event, int64_t taskId, Value instance);
  Value findTriggerCoordinate(DispatchOp dispatch, Value linear, Value &valid);
  Value reduceOverCta(Value n, StringRef op, function_ref<Value(Value)> pred);
  Value countAcrossCta(Value pred);
  Value coordinateOfCount(EventInfo &info, Value count, Value &valid);
  std::optional<unsigned> cachedTableIndex(DispatchOp dispatch);
  Value drawTicket(DispatchOp dispatch, unsigned k);
  void collectCachedTables(ArrayRef<DispatchOp> dispatches);
  std::pair<Value, Value> waitForGuardedTrigger(DispatchOp dispatch,
                                                Value linear, Value &valid,
                                                Operation *prefetch,
                                                unsigned table);
  Value indptrEntry(DispatchOp dispatch, Value at);
  Value triggerBound(DispatchOp dispatch) {
    return gridExtents(dispatch).front();
  }
  void recordFailure(int64_t state,
                     ArrayRef<std::pair<StatusWord, Value>> words,
                     Value stateAddr = Value());
  Value checkTriggerRange(int64_t taskId, Value coordinate, Value begin,
                          Value end, Value bound);
  void recordInstanceOutsideRange(int64_t taskId, Value coordinate, Value begin,
                                  Value end, Value instance);
  Value checkTriggerTable(DispatchOp dispatch);
  Value insideRange(DispatchOp dispatch, Value coordinate, Value linear,
                    Value &begin, Value &end);
  Value allThreads(Value pred);
  std::pair<Value, Value> waitForTrigger(DispatchOp dispatch, Value linear,
                                         Value &valid, Operation *prefetch);
  void callTriggeredPrefetch(DispatchOp dispatch, Operation *prefetch,
                             Value coordinate);
  void lowerNotify(NotifyOp notify);
  Block &mapGridCoordinates(DispatchOp dispatch, Value linear);
  LogicalResult lowerDispatch(DispatchOp dispatch, Value linear, Block *into,
                              ValueRange extraResults = {});
  LogicalResult lowerPooledDispatch(DispatchOp dispatch, Value pool,
                                    Block *into);
  Value drawFromPool(Value counter, Value ahead, Value perPool,
                     Value &nextAhead);
  Value drawFrom(Value counter);
  Value reservedOrDraw(Value reserved, Value counter);
  LogicalResult buildStaticLoop(ArrayRef<DispatchOp> dispatches);
  Value staticSlice();
  /// The static queue's by-SM word, split: (SMs, CTAs per SM), or (0, 0).
  std::pair<Value, Value> queueBySM() {
    Value last = arith::SubIOp::create(
        b, memref::DimOp::create(b, queue, index(0)), index(1));
    Value word = memref::LoadOp::create(b, queue, ValueRange{last});
    auto field = [&](Value v) -> Value {
      return arith::IndexCastUIOp::create(b, b.getIndexType(), v);
    };
    return {field(arith::ShRUIOp::create(b, word, i64(8))),
            field(arith::AndIOp::create(b, word, i64(255)))};
  }
  void prefetchEntry(Value position, Value end,
                     ArrayRef<DispatchOp> dispatches);
  void clonePrefetch(DispatchOp dispatch, Value linear);
  Value prefetchQueueEntry(Value position, Value end,
                           ArrayRef<DispatchOp> candidates, bool reportRan);
  void prefetchAheadOf(DispatchOp current);
  FailureOr<scf::IndexSwitchOp> emitDispatchSwitch(
      Value descriptor, ArrayRef<DispatchOp> dispatches, TypeRange resultTypes,
      function_ref<LogicalResult(DispatchOp, Value, Block *)> lowerCase,
      bool othersAreCorrupt = true);
  LogicalResult buildDynamicLoop(ArrayRef<DispatchOp> dispatches);
  LogicalResult lowerDynamicDispatch(DispatchOp dispatch, Value linear,
                                     Block *into);
  LogicalResult emitThreadZero(ArrayRef<Operation *> ops);
  /// The fan-out loops of a thread-0 section, for the whole CTA (see
  /// emitThreadZero); returns them with their records' live-in values.
  SmallVector<std::pair<scf::ForOp, SmallVector<Value>>>
  takeFanOuts(scf::IfOp ifZero,
              llvm::function_ref<bool(Operation *)> underIfsOnly);
  void runFanOut(scf::ForOp loop, ArrayRef<Value> liveIns, int64_t record);
  void lowerThreadNotify(NotifyOp notify);
  void lowerThreadPush(PushOp push);
  Value claimRingSlots(Value count);
  void reserveRangePush(PushOp push, int64_t record);
  void storePushSlot(Value slot, Value instance, int64_t task, Value capacity);
  void lowerThreadRetire(RetireOp retire);
  void lowerThreadCheckRange(CheckRangeOp check);
  /// The dynamic schedule's termination count: every instance, less those
  /// retired so far (read fresh: retirements only ever lower it). Without an
  /// etensor.retire nothing is retired, and the pops skip the load.
  Value liveTotal() {
    if (!mayRetire)
      return queueCapacity;
    Value retired = asm64("ld.relaxed.gpu.global.u64 $0, [$1];", "=l,l",
                          queueAddress(index(kRetired)));
    return arith::SubIOp::create(
        b, queueCapacity,
        arith::IndexCastOp::create(b, b.getIndexType(), retired));
  }
  /// Thread 0's queue claim: positions [next, end) are claimed and unused;
  /// `pending` is the first position of a chunk already requested.
  struct Claim {
    Value pending, next, end;
  };
  Value pop(ArrayRef<DispatchOp> dispatches, Claim &claim);
  Value requestChunk();
  Value waitCount(EventInfo &info, ValueRange coords);
  SmallVector<Value> gridExtents(DispatchOp dispatch);
  /// Generic address of i64 element `offset` of the queue buffer.
  Value queueAddress(Value offset) {
    Value base =
        toI64(memref::ExtractAlignedPointerAsIndexOp::create(b, queue));
    return arith::AddIOp::create(
        b, base, arith::MulIOp::create(b, toI64(offset), i64(8)));
  }
  void resetCountersForNextLaunch();
  bool checkTableCounts(Value tid, Value threads);
  /// Thread 0's `%globaltimer` (ns), for trace records.
  Value globalTimer() {
    return asm64("mov.u64 $0, %globaltimer;", "=l", ValueRange());
  }
  void recordTrace(Value start, int64_t task, Value linear);

  GraphOp graph;
  gpu::GPUFuncOp kernel;
  ImplicitLocOpBuilder b;
  IRMapping mapping;
  Value counters, queue, status, maxPolls;
  Value peers;       // ranked graphs: each rank's counters address (i64)
  Value traceBuffer; // trace=true: word 0 counts records, 4 words per record
  Value broadcast;   // workgroup i64 slot: the popped task
  /// Dynamic schedule: workgroup i64 words, three per range push of one
  /// section (first slot, first instance, count), from thread 0 to the CTA.
  Value pushRecords;
  Value queueCapacity;               // dynamic schedule: every instance
  bool mayRetire = false;            // the worker holds an etensor.retire
  SmallVector<Value> instanceCounts; // per dispatch, in worker order
  Value readyAtStart;                // instances of tasks without inputs
  Value chunkSize;                   // queue positions per head request
  DenseMap<Value, EventInfo> events; // keyed by the graph's event value
  Value nextEventBase;
  /// The index past the event counters declared so far: the done counter's
  /// once every event is.
  Value countersEnd() { return nextEventBase ? nextEventBase : index(0); }
  bool queueIsStatic = false; // the worker is static: %queue holds its lists
};

} // namespace

LogicalResult KernelBuilder::declareEvent(EventOp event) {
  EventInfo info;
  info.id = events.size();
  info.op = event;
  info.base = countersEnd();
  Value size = index(1);
  for (unsigned d = 0; d < event.getEventType().getRank(); ++d) {
    OpFoldResult extent = event.getMixedSize(d);
    Value v = isa<Attribute>(extent)
                  ? index(cast<IntegerAttr>(cast<Attribute>(extent)).getInt())
                  : mapping.lookup(cast<Value>(extent));
    info.sizes.push_back(v);
    size = arith::MulIOp::create(b, size, v);
  }
  nextEventBase = arith::AddIOp::create(b, info.base, size);
  if (std::optional<int64_t> count = event.getStaticWaitCount())
    info.waitCount = index(*count);
  else if (Value count = event.getWaitCount())
    info.waitCount = mapping.lookup(count);
  else
    info.table = mapping.lookup(event.getWaitCountTable());
  info.ranked = event.getRanked();
  events[event.getEvent()] = info;
  return success();
}

Value KernelBuilder::linearize(ValueRange coords, ArrayRef<Value> sizes) {
  Value linear = index(0);
  for (auto [coord, size] : llvm::zip(coords, sizes))
    linear =
        arith::AddIOp::create(b, arith::MulIOp::create(b, linear, size), coord);
  return linear;
}

SmallVector<Value> KernelBuilder::delinearize(Value linear,
                                              ArrayRef<Value> extents) {
  SmallVector<Value> coords(extents.size());
  for (int64_t d = extents.size() - 1; d >= 0; --d) {
    coords[d] = arith::RemUIOp::create(b, linear, extents[d]);
    linear = arith::DivUIOp::create(b, linear, extents[d]);
  }
  return coords;
}

/// The calling thread polls the counter at `coordinate` of `info` with
/// acquire loads and nanosleep backoff until it reaches `target`, the global
/// abort flag is set, or the watchdog expires (then the first CTA to give up
/// records what it waited for). Returns an i32, 1 when the wait failed.
Value KernelBuilder::pollCounter(EventInfo &info, Value coordinate,
                                 Value target, int64_t taskId, Value instance) {
  Value counterAddr =
      addressOf(counters, arith::AddIOp::create(b, info.base, coordinate));
  Value stateAddr = addressOf(status, index(kState));
  Type i32Ty = b.getI32Type(), i64Ty = b.getI64Type();
  auto loop =
      scf::WhileOp::create(b, TypeRange{i32Ty, i64Ty, i32Ty},
                           ValueRange{i32(0), i64(0), i32(kFirstSleepNs)});
  {
    OpBuilder::InsertionGuard guard(b);
    // before: poll once, stop when done, aborted or out of polls.
    Block *before = b.createBlock(&loop.getBefore(), {}, {i32Ty, i64Ty, i32Ty},
                                  {b.getLoc(), b.getLoc(), b.getLoc()});
    b.setInsertionPointToStart(before);
    Value value = asm32(info.ranked ? "ld.acquire.sys.global.u32 $0, [$1];"
                                    : "ld.acquire.gpu.global.u32 $0, [$1];",
                        "=r,l", counterAddr);
    Value done =
        arith::CmpIOp::create(b, arith::CmpIPredicate::sge, value, target);
    Value state =
        asm32("ld.relaxed.gpu.global.u32 $0, [$1];", "=r,l", stateAddr);
    Value aborted =
        arith::CmpIOp::create(b, arith::CmpIPredicate::ne, state, i32(0));
    Value expired = arith::CmpIOp::create(
        b, arith::CmpIPredicate::sge, before->getArgument(1), toI64(maxPolls));
    Value stop = arith::OrIOp::create(
        b, done, arith::OrIOp::create(b, aborted, expired));
    Value keepGoing =
        arith::XOrIOp::create(b, stop, arith::ConstantIntOp::create(b, 1, 1));
    scf::ConditionOp::create(
        b, keepGoing,
        ValueRange{value, before->getArgument(1), before->getArgument(2)});
    // after: back off (see kMaxSleepNs), count the poll. The yielded value
    // slot is re-polled before use; only polls/sleep carry information.
    Block *after = b.createBlock(&loop.getAfter(), {}, {i32Ty, i64Ty, i32Ty},
                                 {b.getLoc(), b.getLoc(), b.getLoc()});
    b.setInsertionPointToStart(after);
    asmVoid("nanosleep.u32 $0;", "r", after->getArgument(2));
    Value doubled = arith::ShLIOp::create(b, after->getArgument(2), i32(1));
    Value sleep = arith::MinUIOp::create(b, doubled, i32(kMaxSleepNs));
    Value polls = arith::AddIOp::create(b, after->getArgument(1), i64(1));
    scf::YieldOp::create(b, ValueRange{i32(0), polls, sleep});
  }
  Value value = loop.getResult(0);
  Value done =
      arith::CmpIOp::create(b, arith::CmpIPredicate::sge, value, target);
  Value expired = arith::CmpIOp::create(b, arith::CmpIPredicate::sge,
                                        loop.getResult(1), toI64(maxPolls));
  // The first CTA whose watchdog fires records what it was waiting for.
  Value report = arith::AndIOp::create(
      b, expired,
      arith::XOrIOp::create(b, done, arith::ConstantIntOp::create(b, 1, 1)));
  auto ifReport = scf::IfOp::create(b, TypeRange(), report,
                                    /*withElseRegion=*/false);
  {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(ifReport.thenBlock());
    recordFailure(kWatchdog,
                  {{kEventId, i32(info.id)},
                   {kTaskId, i32(taskId)},
                   {kCounter, value},
                   {kWaitCount, target},
                   {kInstance, instance},
                   {kBlock, Value()},
                   {kCoordinate, coordinate}},
                  stateAddr);
  }
  return arith::ExtUIOp::create(
      b, i32Ty,
      arith::XOrIOp::create(b, done, arith::ConstantIntOp::create(b, 1, 1)));
}

/// Joins the CTA: true (uniform) when no thread's `failed` is set.
Value KernelBuilder::noneFailed(Value failed) {
  Value anyFailed = ctaReduce("or", failed);
  return arith::CmpIOp::create(b, arith::CmpIPredicate::eq, anyFailed, i32(0));
}

/// Thread 0 polls linear `coordinate` of the event until it reaches
/// `target` (see pollCounter); `bar.red.or` then joins the CTA and
/// broadcasts failure. Returns an i1 that is true when the wait succeeded
/// (uniform across the CTA).
Value KernelBuilder::waitOnCoordinate(EventInfo &info, Value coordinate,
                                      Value target, int64_t taskId,
                                      Value instance, Value seen) {
  // `seen`: the CTA saw this coordinate complete before; no poll.
  Value polls = isThreadZero();
  if (seen)
    polls = arith::AndIOp::create(
        b, polls,
        arith::XOrIOp::create(b, seen, arith::ConstantIntOp::create(b, 1, 1)));
  auto ifZero = scf::IfOp::create(b, b.getI32Type(), polls,
                                  /*withElseRegion=*/true);
  {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(ifZero.thenBlock());
    scf::YieldOp::create(
        b, pollCounter(info, coordinate, target, taskId, instance));
    b.setInsertionPointToStart(ifZero.elseBlock());
    scf::YieldOp::create(b, ValueRange{i32(0)});
  }
  return noneFailed(ifZero.getResult(0));
}

Value KernelBuilder::lowerWait(WaitOp wait, int64_t taskId, Value instance) {
  EventInfo &info = events[wait.getEvent()];
  SmallVector<Value> coords = llvm::map_to_vector(
      wait.getIndices(), [&](Value v) { return mapping.lookup(v); });
  std::optional<unsigned> cached =
      waitSeen.empty() ? std::nullopt : cachedWaitIndex(wait);
  Value seen = cached ? waitSeen[*cached] : Value();
  Value coordinate = linearize(coords, info.sizes);
  auto poll = [&] {
    return waitOnCoordinate(info, coordinate, waitCount(info, coords), taskId,
                            instance, seen);
  };
  Value ok, key, memo;
  if (memoIndex < 0) {
    ok = poll();
  } else {
    // The memo: `event id << 40 | coordinate` of the CTA's last completed
    // wait. The same key means the same counter and the same wait count,
    // and counters only grow: no poll, and no join (the key is uniform).
    key = arith::OrIOp::create(
        b, i64(info.id << 40),
        arith::AndIOp::create(b, toI64(coordinate), i64((1ll << 40) - 1)));
    memo = waitSeen[memoIndex];
    Value hit = arith::CmpIOp::create(b, arith::CmpIPredicate::eq, key, memo);
    auto ifHit = scf::IfOp::create(b, b.getI1Type(), hit, true);
    {
      OpBuilder::InsertionGuard guard(b);
      b.setInsertionPointToStart(ifHit.thenBlock());
      scf::YieldOp::create(b,
                           arith::ConstantIntOp::create(b, 1, 1).getResult());
      b.setInsertionPointToStart(ifHit.elseBlock());
      scf::YieldOp::create(b, poll());
    }
    ok = ifHit.getResult(0);
  }
  if (cached)
    waitSeen[*cached] = arith::OrIOp::create(b, seen, ok);
  if (memo)
    waitSeen[memoIndex] = arith::SelectOp::create(b, ok, key, memo);
  return ok;
}

/// The wait's coordinates, when all are constants.
static std::optional<SmallVector<int64_t>> constantCoordinates(WaitOp wait) {
  SmallVector<int64_t> coords;
  for (Value v : wait.getIndices()) {
    APInt value;
    if (!matchPattern(v, m_ConstantInt(&value)))
      return std::nullopt;
    coords.push_back(value.getSExtValue());
  }
  return coords;
}

/// The index of `wait` in `cachedWaits`, if it is one.
std::optional<unsigned> KernelBuilder::cachedWaitIndex(WaitOp wait) {
  std::optional<SmallVector<int64_t>> coords = constantCoordinates(wait);
  if (!coords)
    return std::nullopt;
  for (auto [i, cached] : llvm::enumerate(cachedWaits))
    if (cached.event == wait.getEvent() && cached.coords == *coords)
      return i;
  return std::nullopt;
}

/// Fills `cachedWaits` from the in-edge waits of the triggered tasks of
/// `dispatches` (at most kMaxCachedWaits: each is a loop-carried flag). Only
/// triggered tasks: their data-dependent grids give a CTA many instances
/// (the MoE layer's GEMM tiles), where the flags pay; in kernels without
/// them (the Llama decoder) the flags only added registers and the steps
/// got up to 3 % slower (bench/RESULTS.md, item 85).
void KernelBuilder::collectCachedWaits(ArrayRef<DispatchOp> dispatches) {
  constexpr unsigned kMaxCachedWaits = 8;
  for (DispatchOp dispatch : dispatches)
    for (Operation &op : dispatch.getBody().front()) {
      if (!dispatch.getTriggerEvent())
        break;
      auto wait = dyn_cast<WaitOp>(op);
      if (!wait || events[wait.getEvent()].table ||
          cachedWaits.size() == kMaxCachedWaits || cachedWaitIndex(wait))
        continue;
      if (std::optional<SmallVector<int64_t>> coords =
              constantCoordinates(wait))
        cachedWaits.push_back({wait.getEvent(), *coords});
    }
}

/// Static schedule, data-dependent trigger, slow path (see waitForTrigger):
/// the CTA's threads poll every coordinate of the 1-D trigger event in
/// parallel (a thread per coordinate, strided by the CTA size), then join.
/// True (uniform) on success.
Value KernelBuilder::waitForWholeEvent(Value event, int64_t taskId,
                                       Value instance) {
  EventInfo &info = events[event];
  Value tid = gpu::ThreadIdOp::create(b, gpu::Dimension::x);
  Value threads = gpu::BlockDimOp::create(b, gpu::Dimension::x);
  auto loop =
      scf::ForOp::create(b, tid, info.sizes[0], threads, ValueRange{i32(0)});
  {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(loop.getBody());
    Value c = loop.getInductionVar();
    Value failed = pollCounter(info, c, waitCount(info, c), taskId, instance);
    scf::YieldOp::create(b, ValueRange{arith::OrIOp::create(
                                b, loop.getRegionIterArg(0), failed)});
  }
  return noneFailed(loop.getResult(0));
}

/// The trigger coordinate of instance `linear`: the number of entries of the
/// nondecreasing `indptr` (C + 1 of them) that are <= `linear`, minus one.
/// The CTA loads the table in parallel and counts with `bar.red.popc`.
/// `valid` is set when `linear < indptr[C]` (the instance has work).
Value KernelBuilder::findTriggerCoordinate(DispatchOp dispatch, Value linear,
                                           Value &valid) {
  EventInfo &info = events[dispatch.getTriggerEvent()];
  Value entries = arith::AddIOp::create(b, info.sizes[0], index(1));
  Value count = reduceOverCta(entries, "popc", [&](Value at) -> Value {
    Value below = arith::CmpIOp::create(b, arith::CmpIPredicate::ule,
                                        indptrEntry(dispatch, at), linear);
    return arith::ExtUIOp::create(b, b.getI32Type(), below);
  });
  return coordinateOfCount(info, count, valid);
}

/// The CTA's threads take items [0, n) in turns (thread t items t, t +
/// blockDim, ...; a uniform trip count, so every thread joins every
/// reduction); `pred(item)` (i32, nonzero: true) is reduced over the CTA with
/// ctaReduce(`op`) each turn: the sum of the counts ("popc") or whether any
/// held ("or").
Value KernelBuilder::reduceOverCta(Value n, StringRef op,
                                   function_ref<Value(Value)> pred) {
  Value tid = gpu::ThreadIdOp::create(b, gpu::Dimension::x);
  Value threads = gpu::BlockDimOp::create(b, gpu::Dimension::x);
  auto loop = scf::ForOp::create(b, index(0), n, threads, ValueRange{i32(0)});
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPointToStart(loop.getBody());
  Value at = arith::AddIOp::create(b, loop.getInductionVar(), tid);
  Value inside = arith::CmpIOp::create(b, arith::CmpIPredicate::ult, at, n);
  auto ifInside = scf::IfOp::create(b, b.getI32Type(), inside, true);
  {
    OpBuilder::InsertionGuard innerGuard(b);
    b.setInsertionPointToStart(ifInside.thenBlock());
    scf::YieldOp::create(b, ValueRange{pred(at)});
    b.setInsertionPointToStart(ifInside.elseBlock());
    scf::YieldOp::create(b, ValueRange{i32(0)});
  }
  Value reduced = ctaReduce(op, ifInside.getResult(0));
  Value total =
      op == "popc" ? arith::AddIOp::create(b, loop.getRegionIterArg(0), reduced)
                         .getResult()
                   : arith::OrIOp::create(b, loop.getRegionIterArg(0), reduced)
                         .getResult();
  scf::YieldOp::create(b, ValueRange{total});
  return loop.getResult(0);
}

/// The CTA's count of threads whose `pred` (i32) is nonzero; joins the CTA.
Value KernelBuilder::countAcrossCta(Value pred) {
  return ctaReduce("popc", pred);
}

/// The trigger coordinate from `count` (i32), the number of `indptr`
/// entries <= the instance: `count - 1`. `valid` is set when the instance
/// is below `indptr[C]` (fewer than C + 1 entries counted).
Value KernelBuilder::coordinateOfCount(EventInfo &info, Value count,
                                       Value &valid) {
  Value entries = arith::AddIOp::create(b, info.sizes[0], index(1));
  Value below = arith::IndexCastOp::create(
      b, b.getIndexType(), arith::ExtUIOp::create(b, b.getI64Type(), count));
  valid = arith::CmpIOp::create(b, arith::CmpIPredicate::ult, below, entries);
  // indptr[0] = 0 <= linear, so `below` >= 1; clamp anyway so a corrupt
  // table cannot produce a coordinate outside the event.
  Value last = arith::SubIOp::create(b, info.sizes[0], index(1));
  Value coordinate = arith::SubIOp::create(
      b, arith::MaxUIOp::create(b, below, index(1)), index(1));
  return arith::MinUIOp::create(b, coordinate, last);
}

/// Entry `at` of the trigger's `indptr` table, as an index.
Value KernelBuilder::indptrEntry(DispatchOp dispatch, Value at) {
  Value indptr = mapping.lookup(dispatch.getTriggerIndptr());
  Value raw = memref::LoadOp::create(b, indptr, ValueRange{at});
  return arith::IndexCastOp::create(b, b.getIndexType(), raw);
}

/// Records failure `state` and `words` in the status record unless a failure
/// is already recorded (the first stays); a word without a value gets the
/// CTA's index. `stateAddr`: the state word's address, where the caller has
/// it. Any thread may call it; every CTA sees the state at its next poll or
/// pop and stops.
void KernelBuilder::recordFailure(int64_t state,
                                  ArrayRef<std::pair<StatusWord, Value>> words,
                                  Value stateAddr) {
  OpBuilder::InsertionGuard guard(b);
  if (!stateAddr)
    stateAddr = addressOf(status, index(kState));
  Value old = asm32(
      ("atom.relaxed.gpu.global.cas.b32 $0, [$1], 0, " + Twine(state) + ";")
          .str(),
      "=r,l", stateAddr);
  auto ifFirst = scf::IfOp::create(
      b, TypeRange(),
      arith::CmpIOp::create(b, arith::CmpIPredicate::eq, old, i32(0)), false);
  b.setInsertionPointToStart(ifFirst.thenBlock());
  for (auto [word, value] : words) {
    // No value: this CTA's index, read where it is stored.
    if (!value)
      value = gpu::BlockIdOp::create(b, gpu::Dimension::x);
    memref::StoreOp::create(b, toI32(value), status, ValueRange{index(word)});
  }
}

/// Whether range `coordinate` of task `taskId`'s trigger table, [begin,
/// end), lies in its grid of `bound` instances (begin <= end <= bound, and
/// begin == 0 at coordinate 0); records a bad trigger when it does not.
Value KernelBuilder::checkTriggerRange(int64_t taskId, Value coordinate,
                                       Value begin, Value end, Value bound) {
  auto cmp = [&](arith::CmpIPredicate predicate, Value lhs, Value rhs) {
    return arith::CmpIOp::create(b, predicate, lhs, rhs).getResult();
  };
  // One statement each: the IR's order must not follow the C++ compiler's
  // order of evaluating arguments.
  Value notFirst = cmp(arith::CmpIPredicate::ne, coordinate, index(0));
  Value fromZero = cmp(arith::CmpIPredicate::eq, begin, index(0));
  Value nondecreasing = cmp(arith::CmpIPredicate::sle, begin, end);
  Value inGrid = cmp(arith::CmpIPredicate::sle, end, bound);
  Value ok =
      arith::AndIOp::create(b, arith::OrIOp::create(b, notFirst, fromZero),
                            arith::AndIOp::create(b, nondecreasing, inGrid));
  auto ifBad = scf::IfOp::create(
      b, TypeRange(),
      arith::XOrIOp::create(b, ok, arith::ConstantIntOp::create(b, 1, 1)),
      false);
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPointToStart(ifBad.thenBlock());
  recordFailure(kBadTrigger, {{kTaskId, i32(taskId)},
                              {kCoordinate, coordinate},
                              {kCounter, begin},
                              {kWaitCount, end},
                              {kInstance, i32(-1)}});
  return ok;
}

/// Records that instance `instance` of task `taskId` counted coordinate
/// `coordinate` of a final trigger table but lies outside its range [begin,
/// end): the table decreases somewhere.
void KernelBuilder::recordInstanceOutsideRange(int64_t taskId, Value coordinate,
                                               Value begin, Value end,
                                               Value instance) {
  recordFailure(kBadTrigger, {{kTaskId, i32(taskId)},
                              {kCoordinate, coordinate},
                              {kCounter, begin},
                              {kWaitCount, end},
                              {kInstance, instance}});
}

/// Static schedule, once `dispatch`'s trigger table is final (any coordinate
/// of its event completed: the trigger's contract): the CTA checks the C
/// ranges in parallel (checkTriggerRange; the first bad one is recorded).
/// True (uniform) when every range lies in the grid, so counting entries
/// finds each instance's range and none past the bound is left unrun.
Value KernelBuilder::checkTriggerTable(DispatchOp dispatch) {
  EventInfo &info = events[dispatch.getTriggerEvent()];
  Value bound = triggerBound(dispatch);
  Value anyBad = reduceOverCta(info.sizes[0], "or", [&](Value at) -> Value {
    Value begin = indptrEntry(dispatch, at);
    Value end = indptrEntry(dispatch, arith::AddIOp::create(b, at, index(1)));
    Value ok = checkTriggerRange(dispatch.getTask(), at, begin, end, bound);
    Value bad =
        arith::XOrIOp::create(b, ok, arith::ConstantIntOp::create(b, 1, 1));
    return arith::ExtUIOp::create(b, b.getI32Type(), bad);
  });
  return arith::CmpIOp::create(b, arith::CmpIPredicate::eq, anyBad, i32(0));
}

/// Whether `linear` lies in range `coordinate` of `dispatch`'s trigger table;
/// `begin` and `end` are set to the range's entries.
Value KernelBuilder::insideRange(DispatchOp dispatch, Value coordinate,
                                 Value linear, Value &begin, Value &end) {
  begin = indptrEntry(dispatch, coordinate);
  end = indptrEntry(dispatch, arith::AddIOp::create(b, coordinate, index(1)));
  Value fromBegin =
      arith::CmpIOp::create(b, arith::CmpIPredicate::sle, begin, linear);
  Value beforeEnd =
      arith::CmpIOp::create(b, arith::CmpIPredicate::slt, linear, end);
  return arith::AndIOp::create(b, fromBegin, beforeEnd);
}

/// The index of `dispatch`'s trigger table in `cachedTables`, if it is one.
std::optional<unsigned> KernelBuilder::cachedTableIndex(DispatchOp dispatch) {
  if (!dispatch.getGuardedIndptr())
    return std::nullopt;
  for (auto [i, table] : llvm::enumerate(cachedTables))
    if (table == dispatch.getTriggerIndptr())
      return i;
  return std::nullopt;
}

/// Fills `cachedTables` with the trigger tables of the `guarded_indptr`
/// dispatches whose event has a constant size C with C + 1 <= the CTA's
/// threads (a register per thread holds the table).
void KernelBuilder::collectCachedTables(ArrayRef<DispatchOp> dispatches) {
  for (DispatchOp dispatch : dispatches) {
    if (!dispatch.getGuardedIndptr() ||
        llvm::is_contained(cachedTables, dispatch.getTriggerIndptr()))
      continue;
    std::optional<int64_t> size =
        getConstantIntValue(events[dispatch.getTriggerEvent()].sizes[0]);
    if (size && *size + 1 <= blockThreads)
      cachedTables.push_back(dispatch.getTriggerIndptr());
  }
}

/// Static schedule, `guarded_indptr` trigger kept in registers: (wait
/// succeeded, coordinate). The in-edges made the table final, so thread t's
/// entry `indptr[t]` (loaded once per CTA) answers every instance: one
/// `bar.red.popc` finds the coordinate, and neither a second read of the
/// range nor the slow path of waitForTrigger is needed. `valid`: the
/// instance is below `indptr[C]`.
std::pair<Value, Value>
KernelBuilder::waitForGuardedTrigger(DispatchOp dispatch, Value linear,
                                     Value &valid, Operation *prefetch,
                                     unsigned table) {
  EventInfo &info = events[dispatch.getTriggerEvent()];
  Value entries = arith::AddIOp::create(b, info.sizes[0], index(1));
  Value loaded = tableState[2 * table + 1];
  // (the thread's entry, the table checked): a CTA checks the table when it
  // loads it, and keeps it only when it is good (a bad one is loaded and
  // refused again by each instance, which then does not run).
  auto ifLoaded = scf::IfOp::create(
      b, TypeRange{b.getIndexType(), b.getI1Type()}, loaded, true);
  {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(ifLoaded.thenBlock());
    scf::YieldOp::create(b, ValueRange{tableState[2 * table],
                                       arith::ConstantIntOp::create(b, 1, 1)});
    b.setInsertionPointToStart(ifLoaded.elseBlock());
    Value tid = gpu::ThreadIdOp::create(b, gpu::Dimension::x);
    Value inside =
        arith::CmpIOp::create(b, arith::CmpIPredicate::ult, tid, entries);
    auto ifInside = scf::IfOp::create(b, b.getIndexType(), inside, true);
    b.setInsertionPointToStart(ifInside.thenBlock());
    scf::YieldOp::create(b, indptrEntry(dispatch, tid));
    b.setInsertionPointToStart(ifInside.elseBlock());
    // Past the table: above every instance.
    scf::YieldOp::create(
        b, ValueRange{index(std::numeric_limits<int64_t>::max())});
    b.setInsertionPointAfter(ifInside);
    scf::YieldOp::create(
        b, ValueRange{ifInside.getResult(0), checkTriggerTable(dispatch)});
  }
  Value entry = ifLoaded.getResult(0), tableOk = ifLoaded.getResult(1);
  tableState[2 * table] = entry;
  Value below = arith::ExtUIOp::create(
      b, b.getI32Type(),
      arith::CmpIOp::create(b, arith::CmpIPredicate::ule, entry, linear));
  Value coordinate = coordinateOfCount(info, countAcrossCta(below), valid);
  auto ifValid = scf::IfOp::create(b, b.getI1Type(), valid, true);
  {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(ifValid.thenBlock());
    callTriggeredPrefetch(dispatch, prefetch, coordinate);
    scf::YieldOp::create(
        b, waitOnCoordinate(info, coordinate,
                            waitCount(info, ValueRange{coordinate}),
                            dispatch.getTask(), linear));
    b.setInsertionPointToStart(ifValid.elseBlock());
    // Past indptr[C], final: no work and nothing to wait for.
    scf::YieldOp::create(b, ValueRange{arith::ConstantIntOp::create(b, 1, 1)});
  }
  return {arith::AndIOp::create(b, ifValid.getResult(0), tableOk), coordinate};
}

/// Joins the CTA: true (uniform) when `pred` holds on every thread.
Value KernelBuilder::allThreads(Value pred) {
  Value asI32 = arith::ExtUIOp::create(b, b.getI32Type(), pred);
  Value all = ctaReduce("and", asI32);
  return arith::CmpIOp::create(b, arith::CmpIPredicate::ne, all, i32(0));
}

/// Static schedule, data-dependent trigger: (wait succeeded, coordinate).
/// The in-edges were waited for, so `indptr` is normally final: the
/// instance finds its coordinate `c` there and waits for `e[c]` alone, so
/// an instance starts when its own coordinate completes. Once `e[c]` has
/// completed, `indptr[c]` and `indptr[c+1]` are final (the schedules'
/// contract, as under the dynamic one) and are read again: if the instance
/// is not in that range (the first read saw a table still being written) or
/// was past `indptr[C]`, it waits for the whole event and searches again.
///
/// `prefetch` (the task's prefetch call, or null) runs once the coordinate
/// is known and before the trigger wait: an expert's weights load while its
/// activations are still being written. It may depend on the coordinate, the
/// instance and `indptr[c]`, `indptr[c+1]`. When the second search finds
/// another coordinate, or the same one with another range than the prefetch
/// saw (no in-edge guarded the table), the guessed prefetch's copies are
/// drained (`cp.async`: the only asynchronous copies a prefetch issues into
/// shared memory) and the prefetch runs again for the coordinate found.
std::pair<Value, Value> KernelBuilder::waitForTrigger(DispatchOp dispatch,
                                                      Value linear,
                                                      Value &valid,
                                                      Operation *prefetch) {
  Value event = dispatch.getTriggerEvent();
  int64_t taskId = dispatch.getTask();
  EventInfo &info = events[event];
  Value guessValid;
  Value guess = findTriggerCoordinate(dispatch, linear, guessValid);
  Type i1 = b.getI1Type();
  // (wait succeeded, instance inside indptr[c]..indptr[c+1]).
  auto ifGuess = scf::IfOp::create(b, TypeRange{i1, i1}, guessValid, true);
  {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(ifGuess.thenBlock());
    Value next = arith::AddIOp::create(b, guess, index(1));
    // The range the prefetch decodes its tile from, read before it runs.
    Value seenLo, seenHi;
    if (prefetch) {
      seenLo = indptrEntry(dispatch, guess);
      seenHi = indptrEntry(dispatch, next);
    }
    callTriggeredPrefetch(dispatch, prefetch, guess);
    Value ok = waitOnCoordinate(info, guess, waitCount(info, ValueRange{guess}),
                                taskId, linear);
    Value lo = indptrEntry(dispatch, guess);
    Value hi = indptrEntry(dispatch, next);
    Value inside = arith::AndIOp::create(
        b, arith::CmpIOp::create(b, arith::CmpIPredicate::ule, lo, linear),
        arith::CmpIOp::create(b, arith::CmpIPredicate::ult, linear, hi));
    if (prefetch) {
      // Same coordinate, but a range read while the table was still being
      // written: the prefetch may have loaded another tile's operands.
      Value same = arith::AndIOp::create(
          b, arith::CmpIOp::create(b, arith::CmpIPredicate::eq, lo, seenLo),
          arith::CmpIOp::create(b, arith::CmpIPredicate::eq, hi, seenHi));
      inside = arith::AndIOp::create(b, inside, same);
    }
    scf::YieldOp::create(b, ValueRange{ok, allThreads(inside)});
    b.setInsertionPointToStart(ifGuess.elseBlock());
    Value yes = arith::ConstantIntOp::create(b, 1, 1);
    Value no = arith::ConstantIntOp::create(b, 0, 1);
    scf::YieldOp::create(b, ValueRange{yes, no});
  }
  Value ok = ifGuess.getResult(0), inside = ifGuess.getResult(1);
  // The bound's last instance always checks the whole table: a range past
  // the bound has no instance of its own to notice it.
  Value last = arith::CmpIOp::create(
      b, arith::CmpIPredicate::eq, linear,
      arith::SubIOp::create(b, triggerBound(dispatch), index(1)));
  Value fast = arith::OrIOp::create(
      b,
      arith::AndIOp::create(
          b, inside,
          arith::XOrIOp::create(b, last,
                                arith::ConstantIntOp::create(b, 1, 1))),
      arith::XOrIOp::create(b, ok, arith::ConstantIntOp::create(b, 1, 1)));
  // (wait succeeded, coordinate, has work).
  auto ifFast =
      scf::IfOp::create(b, TypeRange{i1, b.getIndexType(), i1}, fast, true);
  {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(ifFast.thenBlock());
    // Found, or a failed wait (reported): no second search.
    scf::YieldOp::create(b, ValueRange{ok, guess, inside});
    b.setInsertionPointToStart(ifFast.elseBlock());
    Value wholeOk = waitForWholeEvent(event, taskId, linear);
    // The table is final now: a bad one stops the launch here, before a
    // count over it could pick a range the instance is not in.
    auto ifWhole = scf::IfOp::create(b, i1, wholeOk, true);
    {
      OpBuilder::InsertionGuard wholeGuard(b);
      b.setInsertionPointToStart(ifWhole.thenBlock());
      scf::YieldOp::create(b, checkTriggerTable(dispatch));
      b.setInsertionPointToStart(ifWhole.elseBlock());
      scf::YieldOp::create(b, wholeOk);
    }
    wholeOk = ifWhole.getResult(0);
    Value found;
    Value coordinate = findTriggerCoordinate(dispatch, linear, found);
    if (prefetch) {
      asmVoid("cp.async.wait_all;", "", ValueRange());
      auto ifFound = scf::IfOp::create(b, TypeRange(), found, false);
      OpBuilder::InsertionGuard foundGuard(b);
      b.setInsertionPointToStart(ifFound.thenBlock());
      callTriggeredPrefetch(dispatch, prefetch, coordinate);
    }
    scf::YieldOp::create(b, ValueRange{wholeOk, coordinate, found});
  }
  valid = ifFast.getResult(2);
  return {ifFast.getResult(0), ifFast.getResult(1)};
}

/// The prefetch call of a triggered instance whose trigger coordinate (the
/// body's second argument) is `coordinate`.
void KernelBuilder::callTriggeredPrefetch(DispatchOp dispatch,
                                          Operation *prefetch,
                                          Value coordinate) {
  if (!prefetch)
    return;
  mapping.map(dispatch.getBody().front().getArgument(1), coordinate);
  b.clone(*prefetch, mapping);
}

/// CTA barrier so the whole task's writes happen-before thread 0's release
/// add on the counter.
void KernelBuilder::lowerNotify(NotifyOp notify) {
  EventInfo &info = events[notify.getEvent()];
  SmallVector<Value> coords = llvm::map_to_vector(
      notify.getIndices(), [&](Value v) { return mapping.lookup(v); });
  auto [addr, scope] = notifyAddress(info, coords);
  ctaBarrier();
  auto ifZero = scf::IfOp::create(b, TypeRange(), isThreadZero(), false);
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPointToStart(ifZero.thenBlock());
  asmVoid(("red.release." + scope + ".global.add.u32 [$0], 1;").str(), "l",
          addr);
}

/// Maps the dispatch body's grid-coordinate arguments to the coordinates of
/// linear instance `linear`; returns the body.
Block &KernelBuilder::mapGridCoordinates(DispatchOp dispatch, Value linear) {
  SmallVector<Value> coords = delinearize(linear, gridExtents(dispatch));
  Block &body = dispatch.getBody().front();
  for (auto [arg, coord] : llvm::zip(body.getArguments(), coords))
    mapping.map(arg, coord);
  return body;
}

/// Emits one task instance into `into` (a switch case): the waits, then the
/// rest of the body under `scf.if` of their success. Yields success, the
/// loop-carried state, then `extraResults`.
LogicalResult KernelBuilder::lowerDispatch(DispatchOp dispatch, Value linear,
                                           Block *into,
                                           ValueRange extraResults) {
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPointToEnd(into); // after what computed `linear`, if anything
  waitSeen = loopSeen;
  tableState = loopTableState;
  ticketState = loopTicketState;
  // A ticketed entry runs the instance it draws, not the one it names.
  if (auto *at = llvm::find(ticketed, dispatch); at != ticketed.end())
    linear = drawTicket(dispatch, at - ticketed.begin());
  Block &body = mapGridCoordinates(dispatch, linear);
  Value ok = arith::ConstantIntOp::create(b, 1, 1);
  auto it = body.begin();
  // A triggered task's prefetch needs its coordinate: waitForTrigger calls it.
  Operation *triggeredPrefetch = nullptr;
  aheadRan = Value();
  // Waits lead the body (etensor-static-schedule puts them there). A
  // triggered task's in-edges cannot use its trigger coordinate, so they
  // come first: they may guard the tables the trigger reads.
  bool waited = false;
  for (; it != body.end(); ++it) {
    // Index arithmetic of the edge maps (constants, divisions) feeds them.
    if (isHoistable(*it)) {
      bool isCall = isa<func::CallOp>(*it);
      if (dispatch.getTriggerEvent() && isCall) {
        triggeredPrefetch = &*it;
      } else if (isCall && (prefetchAhead || waited)) {
        // Skipped when the previous entry ran it ahead; after waits
        // (prefetch_after), only when they succeeded: it reads what their
        // producers wrote.
        Value run;
        if (prefetchAhead)
          run = arith::XOrIOp::create(b, prefetchedAhead,
                                      arith::ConstantIntOp::create(b, 1, 1));
        if (waited)
          run = run ? arith::AndIOp::create(b, ok, run).getResult() : ok;
        auto ifRun = scf::IfOp::create(b, TypeRange(), run, false);
        OpBuilder::InsertionGuard callGuard(b);
        b.setInsertionPointToStart(ifRun.thenBlock());
        b.clone(*it, mapping);
      } else {
        b.clone(*it, mapping);
      }
      continue;
    }
    // After the entry's own prefetch, before its first wait.
    if (prefetchAhead && !aheadRan)
      prefetchAheadOf(dispatch);
    auto wait = dyn_cast<WaitOp>(*it);
    if (!wait)
      break;
    ok = arith::AndIOp::create(b, ok,
                               lowerWait(wait, dispatch.getTask(), linear));
    waited = true;
  }
  if (prefetchAhead && !aheadRan)
    prefetchAheadOf(dispatch);
  Value run = ok;
  if (dispatch.getTriggerEvent()) {
    // Only after successful in-edge waits: they may guard the tables.
    Type i1 = b.getI1Type();
    std::optional<unsigned> table = cachedTableIndex(dispatch);
    SmallVector<Type> types{i1, b.getIndexType(), i1};
    if (table)
      types.push_back(b.getIndexType()); // the CTA's register table entry
    auto ifIn = scf::IfOp::create(b, types, ok, true);
    {
      OpBuilder::InsertionGuard triggerGuard(b);
      b.setInsertionPointToStart(ifIn.thenBlock());
      Value valid;
      auto [triggerOk, coordinate] =
          table ? waitForGuardedTrigger(dispatch, linear, valid,
                                        triggeredPrefetch, *table)
                : waitForTrigger(dispatch, linear, valid, triggeredPrefetch);
      SmallVector<Value> results{triggerOk, coordinate, valid};
      if (table)
        results.push_back(tableState[2 * *table]);
      scf::YieldOp::create(b, results);
      b.setInsertionPointToStart(ifIn.elseBlock());
      Value no = arith::ConstantIntOp::create(b, 0, 1);
      results = {no, index(0), no};
      if (table)
        results.push_back(loopTableState[2 * *table]);
      scf::YieldOp::create(b, results);
    }
    if (table) {
      // Loaded by the then-branch: the in-edges succeeded.
      tableState[2 * *table] = ifIn.getResult(3);
      tableState[2 * *table + 1] = arith::OrIOp::create(
          b, loopTableState[2 * *table + 1], ifIn.getResult(0));
    }
    ok = ifIn.getResult(0);
    mapping.map(body.getArgument(1), ifIn.getResult(1));
    // Past indptr[C]: no work, but the static loop goes on.
    run = arith::AndIOp::create(b, ok, ifIn.getResult(2));
  }
  auto ifOk = scf::IfOp::create(b, TypeRange(), run, false);
  {
    OpBuilder::InsertionGuard bodyGuard(b);
    b.setInsertionPointToStart(ifOk.thenBlock());
    Value start = traceBuffer ? globalTimer() : Value();
    bool endsWithNotify = false;
    for (; it != body.end(); ++it) {
      Operation &op = *it;
      if (isa<YieldOp>(op))
        continue;
      endsWithNotify = false;
      if (auto notify = dyn_cast<NotifyOp>(op)) {
        if (notify.getCompleted())
          return notify.emitOpError(
              "with a result needs the dynamic schedule lowering");
        lowerNotify(notify);
        endsWithNotify = true;
        continue;
      }
      if (isa<WaitOp>(op))
        return op.emitOpError("must come before every other op of its "
                              "dispatch body");
      if (op.getDialect() && isa<ETensorDialect>(op.getDialect()))
        return op.emitOpError("is not supported by the static lowering");
      bool nested = false;
      op.walk([&](Operation *inner) {
        if (inner != &op && isa<WaitOp, NotifyOp, PushOp, PopOp>(inner))
          nested = true;
      });
      if (nested)
        return op.emitOpError("holds nested etensor synchronisation, which "
                              "the static lowering does not support");
      b.clone(op, mapping);
    }
    // The next task may reuse shared memory: join the CTA first.
    if (!endsWithNotify)
      ctaBarrier();
    if (traceBuffer)
      recordTrace(start, dispatch.getTaskAttr().getInt(), linear);
  }
  SmallVector<Value> results{ok};
  if (prefetchAhead)
    results.push_back(aheadRan);
  results.append(waitSeen);
  results.append(tableState);
  results.append(ticketState);
  llvm::append_range(results, extraResults);
  scf::YieldOp::create(b, results);
  return success();
}

/// Static schedule, a `pool(...)` entry: runs the instances of pool `pool`
/// (the entry's instance field) that the CTA draws from the pool's counter,
/// until a draw passes the pool's size. Draws go in linear order within the
/// pool, so an instance only waits on instances drawn before it or on
/// earlier entries of the global order, as the lists' instances do. Thread 0
/// draws the next instance as the current one starts while many are left
/// (`drawFromPool`), so the atomic's round trip overlaps it. Each CTA draws
/// once past the end; the exit reset zeroes the counters.
LogicalResult KernelBuilder::lowerPooledDispatch(DispatchOp dispatch,
                                                 Value pool, Block *into) {
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPointToStart(into);
  // Instance `k` of pool `p` along dimension `d` has coordinate p there and
  // the others, row-major, from k: linear = (k / inner) * (n_d * inner) +
  // p * inner + k % inner, `inner` the extent of the dimensions after d.
  SmallVector<Value> extents = gridExtents(dispatch);
  IntegerAttr poolDim = dispatch.getPoolDimAttr();
  Value perPool = index(1), inner = index(1);
  for (auto [d, extent] : llvm::enumerate(extents)) {
    if (poolDim && static_cast<int64_t>(d) == poolDim.getInt())
      continue;
    perPool = arith::MulIOp::create(b, perPool, extent);
    if (poolDim && static_cast<int64_t>(d) > poolDim.getInt())
      inner = arith::MulIOp::create(b, inner, extent);
  }
  EventInfo &info = events[dispatch.getPool()];
  Value counter = addressOf(
      counters, poolDim ? arith::AddIOp::create(b, info.base, pool).getResult()
                        : info.base);

  // Carried: success, the static loop's state, thread 0's draw ahead.
  SmallVector<Value> inits{arith::ConstantIntOp::create(b, 1, 1)};
  llvm::append_range(inits, loopSeen);
  llvm::append_range(inits, loopTableState);
  llvm::append_range(inits, loopTicketState);
  inits.push_back(index(-1));
  SmallVector<Type> carried =
      llvm::map_to_vector(inits, [](Value v) { return v.getType(); });
  SmallVector<Type> passed(carried);
  passed.push_back(b.getIndexType()); // the drawn instance
  auto loop = scf::WhileOp::create(b, passed, inits, nullptr, nullptr);
  {
    OpBuilder::InsertionGuard drawGuard(b);
    Block *before = loop.getBeforeBody();
    b.setInsertionPointToStart(before);
    Value nextAhead;
    Value drawn = drawFromPool(counter, before->getArguments().back(), perPool,
                               nextAhead);
    Value more = arith::AndIOp::create(
        b, before->getArgument(0),
        arith::CmpIOp::create(b, arith::CmpIPredicate::ult, drawn, perPool));
    SmallVector<Value> forward(before->getArguments().drop_back());
    forward.push_back(nextAhead);
    forward.push_back(drawn);
    scf::ConditionOp::create(b, more, forward);
  }
  Block *after = loop.getAfterBody();
  {
    OpBuilder::InsertionGuard runGuard(b);
    b.setInsertionPointToStart(after);
    Value k = after->getArguments().back();
    Value linear = k;
    if (poolDim) {
      Value inPool = arith::MulIOp::create(b, inner, extents[poolDim.getInt()]);
      linear = arith::AddIOp::create(
          b,
          arith::MulIOp::create(b, arith::DivUIOp::create(b, k, inner), inPool),
          arith::AddIOp::create(b, arith::MulIOp::create(b, pool, inner),
                                arith::RemUIOp::create(b, k, inner)));
    }
    // lowerDispatch starts from the loop-carried state: this iteration's.
    SmallVector<Value> outerSeen = loopSeen, outerTables = loopTableState,
                       outerTickets = loopTicketState;
    auto state = after->getArguments().drop_front();
    size_t seen = loopSeen.size(), tables = loopTableState.size();
    loopSeen.assign(state.begin(), state.begin() + seen);
    loopTableState.assign(state.begin() + seen, state.begin() + seen + tables);
    loopTicketState.assign(state.begin() + seen + tables, state.end() - 2);
    LogicalResult lowered =
        lowerDispatch(dispatch, linear, after,
                      after->getArgument(after->getNumArguments() - 2));
    loopSeen = outerSeen;
    loopTableState = outerTables;
    loopTicketState = outerTickets;
    if (failed(lowered))
      return failure();
  }
  // Every thread read the last draw before thread 0 may write the broadcast
  // word again for the CTA's next entry.
  ctaBarrier();
  SmallVector<Value> results(loop.getResults().drop_back(2));
  scf::YieldOp::create(b, results);
  return success();
}

/// Thread 0: draws from a ticket or pool counter (a relaxed atomic add:
/// draws need only be unique), the counter's old value as an index.
Value KernelBuilder::drawFrom(Value counter) {
  Value old =
      asm32("atom.relaxed.gpu.global.add.u32 $0, [$1], 1;", "=r,l", counter);
  return arith::IndexCastOp::create(
      b, b.getIndexType(), arith::ExtUIOp::create(b, b.getI64Type(), old));
}

/// Thread 0: `reserved`, a draw made ahead, or when that is -1 a draw now.
Value KernelBuilder::reservedOrDraw(Value reserved, Value counter) {
  Value have =
      arith::CmpIOp::create(b, arith::CmpIPredicate::ne, reserved, index(-1));
  auto ifHave = scf::IfOp::create(b, b.getIndexType(), have, true);
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPointToStart(ifHave.thenBlock());
  scf::YieldOp::create(b, reserved);
  b.setInsertionPointToStart(ifHave.elseBlock());
  scf::YieldOp::create(b, drawFrom(counter));
  return ifHave.getResult(0);
}

/// Thread 0 takes the instance it drew ahead (`ahead`, or draws now when
/// -1) and, while two per CTA are left after it, draws the next
/// (`nextAhead`; -1 on other threads): near the pool's end a CTA draws only
/// when free, so the last instances go to the CTAs free first. The drawn
/// instance reaches the CTA through the workgroup broadcast word.
Value KernelBuilder::drawFromPool(Value counter, Value ahead, Value perPool,
                                  Value &nextAhead) {
  Type indexTy = b.getIndexType();
  auto ifZero =
      scf::IfOp::create(b, TypeRange{indexTy, indexTy}, isThreadZero(), true);
  {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(ifZero.thenBlock());
    Value current = reservedOrDraw(ahead, counter);
    // Drawing ahead reserves an instance that a CTA free sooner could run:
    // only while two per CTA stay undrawn after it, so the last two rounds
    // go to whichever CTAs are free (a stage of two rounds never draws
    // ahead).
    Value ctas = gpu::GridDimOp::create(b, gpu::Dimension::x);
    Value plenty = arith::CmpIOp::create(
        b, arith::CmpIPredicate::ult,
        arith::AddIOp::create(b, current,
                              arith::MulIOp::create(b, ctas, index(2))),
        perPool);
    auto ifMore = scf::IfOp::create(b, indexTy, plenty, true);
    b.setInsertionPointToStart(ifMore.thenBlock());
    scf::YieldOp::create(b, drawFrom(counter));
    b.setInsertionPointToStart(ifMore.elseBlock());
    scf::YieldOp::create(b, index(-1));
    b.setInsertionPointAfter(ifMore);
    memref::StoreOp::create(b, toI64(current), broadcast, ValueRange{index(0)});
    scf::YieldOp::create(b, ValueRange{current, ifMore.getResult(0)});
    b.setInsertionPointToStart(ifZero.elseBlock());
    scf::YieldOp::create(b, ValueRange{index(0), index(-1)});
  }
  nextAhead = ifZero.getResult(1);
  ctaBarrier();
  Value drawn = memref::LoadOp::create(b, broadcast, ValueRange{index(0)});
  return arith::IndexCastOp::create(b, indexTy, drawn);
}

/// Static schedule, `ticketed` dispatch number `k`: the instance this entry
/// runs, uniform across the CTA. Thread 0 takes the ticket it drew ahead at
/// the CTA's previous entry (or draws one now: a relaxed atomic add on the
/// task's ticket counter; tickets need only be unique) and, when the CTA's
/// next entry is of the same task, draws that entry's ticket now, so the
/// atomic's round trip overlaps this instance. Every entry draws exactly
/// one ticket, so the entries of the task, as many as its instances, run
/// each instance once. The ticket reaches the CTA through the workgroup
/// broadcast word.
Value KernelBuilder::drawTicket(DispatchOp dispatch, unsigned k) {
  Value counter = addressOf(counters, events[dispatch.getTicket()].base);
  Value none = index(-1);
  Type indexTy = b.getIndexType();
  auto ifZero =
      scf::IfOp::create(b, TypeRange{indexTy, indexTy}, isThreadZero(), true);
  {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(ifZero.thenBlock());
    Value ticket = reservedOrDraw(ticketState[k], counter);
    Value inSlice = arith::CmpIOp::create(b, arith::CmpIPredicate::ult,
                                          nextPosition, sliceEnd);
    auto ifNext = scf::IfOp::create(b, b.getI1Type(), inSlice, true);
    b.setInsertionPointToStart(ifNext.thenBlock());
    Value entry = memref::LoadOp::create(b, queue, ValueRange{nextPosition});
    Value task = arith::ShRUIOp::create(b, entry, i64(kInstanceBits));
    scf::YieldOp::create(
        b, ValueRange{arith::CmpIOp::create(b, arith::CmpIPredicate::eq, task,
                                            i64(dispatch.getTask()))});
    b.setInsertionPointToStart(ifNext.elseBlock());
    scf::YieldOp::create(b, ValueRange{arith::ConstantIntOp::create(b, 0, 1)});
    b.setInsertionPointAfter(ifNext);
    auto ifSame = scf::IfOp::create(b, indexTy, ifNext.getResult(0), true);
    b.setInsertionPointToStart(ifSame.thenBlock());
    scf::YieldOp::create(b, drawFrom(counter));
    b.setInsertionPointToStart(ifSame.elseBlock());
    scf::YieldOp::create(b, none);
    b.setInsertionPointAfter(ifSame);
    memref::StoreOp::create(b, toI64(ticket), broadcast, ValueRange{index(0)});
    scf::YieldOp::create(b, ValueRange{ticket, ifSame.getResult(0)});
    b.setInsertionPointToStart(ifZero.elseBlock());
    scf::YieldOp::create(b, ValueRange{index(0), ticketState[k]});
  }
  ticketState[k] = ifZero.getResult(1);
  ctaBarrier();
  Value ticket = memref::LoadOp::create(b, broadcast, ValueRange{index(0)});
  return arith::IndexCastOp::create(b, indexTy, ticket);
}

/// The kernel has a counterpart for every graph-level value it maps (index
/// and memref values, cloned ops' results) and for the declared events,
/// which only waits and notifications may use; pushes name the one queue.
/// Anything else (a cast event, a popped descriptor) cannot be lowered.
LogicalResult KernelBuilder::checkKernelOperands(Operation *root, bool nested) {
  auto check = [&](Operation *op) {
    for (Value value : op->getOperands()) {
      if (value.getParentRegion() != &graph.getBody() ||
          mapping.contains(value))
        continue;
      if (isa<WaitOp, NotifyOp>(op) && value == op->getOperand(0) &&
          events.count(value))
        continue;
      if (auto dispatch = dyn_cast<DispatchOp>(op))
        if ((value == dispatch.getTriggerEvent() ||
             value == dispatch.getTicket() || value == dispatch.getPool()) &&
            events.count(value))
          continue;
      if (isa<PushOp, RetireOp, WorkerOp>(op) &&
          isa<QueueType>(value.getType()))
        continue;
      op->emitOpError("uses a value of type ")
          << value.getType() << " that convert-etensor-to-gpu cannot map "
          << "into the kernel";
      return WalkResult::interrupt();
    }
    return WalkResult::advance();
  };
  if (!nested)
    return failure(check(root).wasInterrupted());
  return failure(root->walk(check).wasInterrupted());
}

LogicalResult KernelBuilder::build() {
  graph.walk([&](DispatchOp dispatch) {
    if (dispatch.getPool() || dispatch.getTicket())
      nonAlignedBarriers = true;
  });
  // Ranked graphs: the rank barrier's two words come first, at offsets no
  // shape moves (the events' counters follow them).
  if (peers)
    nextEventBase = index(kRankBarrierWords);
  WorkerOp worker;
  for (Operation &op : graph.getBodyBlock()) {
    if (auto event = dyn_cast<EventOp>(op)) {
      if (failed(declareEvent(event)))
        return failure();
      continue;
    }
    if (auto w = dyn_cast<WorkerOp>(op)) {
      if (worker)
        return w.emitOpError("a graph holds one worker");
      worker = w;
      continue;
    }
    if (auto queueOp = dyn_cast<QueueOp>(op)) {
      if (queueCapacity)
        return queueOp.emitOpError("a graph holds one queue");
      queueCapacity = mapping.lookup(queueOp.getCapacity());
      continue;
    }
    if (isa<TaskOp>(op))
      return op.emitOpError("is not scheduled; run etensor-static-schedule "
                            "or etensor-dynamic-schedule first");
    if (op.getDialect() && isa<ETensorDialect>(op.getDialect()))
      return op.emitOpError("is not supported at graph level by "
                            "convert-etensor-to-gpu");
    if (failed(checkKernelOperands(&op)))
      return failure();
    b.clone(op, mapping);
  }
  if (!worker)
    return graph.emitOpError("has no etensor.worker; run a scheduling pass "
                             "first");
  SmallVector<DispatchOp> dispatches(
      worker.getBody().front().getOps<DispatchOp>());
  // Queue entries hold the task in the bits above the instance; a push
  // stores task + 1 there.
  WalkResult invalid = worker.walk([&](Operation *op) {
    int64_t task = -1;
    if (auto dispatch = dyn_cast<DispatchOp>(op))
      task = dispatch.getTaskAttr().getInt();
    else if (auto push = dyn_cast<PushOp>(op))
      task = push.getTaskAttr().getInt();
    if (task >= kMaxTasks) {
      op->emitOpError("task index ")
          << task << " does not fit the queue descriptor (at most "
          << kMaxTasks - 1 << ")";
      return WalkResult::interrupt();
    }
    return failed(checkKernelOperands(op, /*nested=*/false))
               ? WalkResult::interrupt()
               : WalkResult::advance();
  });
  if (invalid.wasInterrupted())
    return failure();
  for (DispatchOp dispatch : dispatches) {
    Value size = index(1);
    for (Value extent : gridExtents(dispatch))
      size = arith::MulIOp::create(b, size, extent);
    instanceCounts.push_back(size);
  }
  readyAtStart = index(0);
  for (auto [dispatch, count] : llvm::zip(dispatches, instanceCounts))
    if (dispatch->hasAttr("etensor.ready_at_start"))
      readyAtStart = arith::AddIOp::create(b, readyAtStart, count);
  // Ranked graphs: no CTA works before every rank has started this launch.
  scf::IfOp allArrived;
  if (peers) {
    allArrived = scf::IfOp::create(b, TypeRange(), waitForAllRanks(), false);
    b.setInsertionPointToStart(allArrived.thenBlock());
  }
  if (worker.getSchedule() == ScheduleKind::Dynamic) {
    mayRetire = worker.walk([](RetireOp) { return WalkResult::interrupt(); })
                    .wasInterrupted();
    if (failed(buildDynamicLoop(dispatches)))
      return failure();
  } else {
    queueIsStatic = true;
    if (failed(buildStaticLoop(dispatches)))
      return failure();
  }
  if (allArrived)
    b.setInsertionPointAfter(allArrived);
  resetCountersForNextLaunch();
  gpu::ReturnOp::create(b);
  return success();
}

/// The shared region of a dispatch's task (`shared_region`, default 0).
static int64_t sharedRegion(DispatchOp dispatch) {
  IntegerAttr region = dispatch.getSharedRegionAttr();
  return region ? region.getInt() : 0;
}

/// Whether a dispatch's body calls a prefetch function that may run ahead:
/// tasks with a trigger find their coordinate only after waiting, and a
/// prefetch placed after waits (prefetch_after) reads what they guard.
static bool hasAheadPrefetch(DispatchOp dispatch) {
  // A ticketed or pooled entry's instance is known only once it drew it.
  if (dispatch.getTriggerEvent() || dispatch.getTicket() || dispatch.getPool())
    return false;
  for (Operation &op : dispatch.getBody().front()) {
    if (isa<WaitOp>(op))
      return false;
    if (isa<func::CallOp>(op) && op.hasAttr(kPrefetchAttrName))
      return true;
  }
  return false;
}

/// `sm-slices`: the CTA's slice of the static queue. The queue's last word is
/// `S << 8 | occ` when the runtime dealt it by SM (etc.runtime.queue.sm_deal:
/// slice `k * S + s` for SM `s`), else 0. The k-th CTA to start on SM
/// `%smid` (thread 0's atomic on counters[total + 1 + %smid]) takes slice
/// `k * S + %smid`, provided the device numbers its SMs 0..S-1 (`%nsmid ==
/// S`) and the grid is `S * occ`: every CTA decides alike, and co-residency
/// puts exactly `occ` CTAs on each SM. Otherwise slice `%ctaid.x`. Status
/// and trace records still name the CTA by `%ctaid.x`.
Value KernelBuilder::staticSlice() {
  Value block = gpu::BlockIdOp::create(b, gpu::Dimension::x);
  Value grid = gpu::GridDimOp::create(b, gpu::Dimension::x);
  Type indexTy = b.getIndexType();
  auto asIndex = [&](Value v) -> Value {
    return arith::IndexCastUIOp::create(b, indexTy, v);
  };
  auto cmp = [&](arith::CmpIPredicate p, Value x, Value y) -> Value {
    return arith::CmpIOp::create(b, p, x, y);
  };
  auto [sms, occ] = queueBySM();
  Value total = countersEnd();
  auto ifZero = scf::IfOp::create(b, indexTy, isThreadZero(), true);
  {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(ifZero.thenBlock());
    Value nsmid = asIndex(asm32("mov.u32 $0, %nsmid;", "=r", ValueRange()));
    Value on = arith::AndIOp::create(
        b,
        arith::AndIOp::create(b, cmp(arith::CmpIPredicate::ne, sms, index(0)),
                              cmp(arith::CmpIPredicate::eq, nsmid, sms)),
        cmp(arith::CmpIPredicate::eq, arith::MulIOp::create(b, sms, occ),
            grid));
    auto ifOn = scf::IfOp::create(b, indexTy, on, true);
    b.setInsertionPointToStart(ifOn.thenBlock());
    Value sm = asIndex(asm32("mov.u32 $0, %smid;", "=r", ValueRange()));
    Value counter = addressOf(
        counters, arith::AddIOp::create(
                      b, arith::AddIOp::create(b, total, index(1)), sm));
    Value k = asIndex(
        asm32("atom.relaxed.gpu.global.add.u32 $0, [$1], 1;", "=r,l", counter));
    scf::YieldOp::create(
        b, ValueRange{arith::SelectOp::create(
               b, cmp(arith::CmpIPredicate::ult, k, occ),
               arith::AddIOp::create(b, arith::MulIOp::create(b, k, sms), sm),
               block)});
    b.setInsertionPointToStart(ifOn.elseBlock());
    scf::YieldOp::create(b, ValueRange{block});
    b.setInsertionPointAfter(ifOn);
    memref::StoreOp::create(b, toI64(ifOn.getResult(0)), broadcast,
                            ValueRange{index(1)});
    scf::YieldOp::create(b, ValueRange{ifOn.getResult(0)});
    b.setInsertionPointToStart(ifZero.elseBlock());
    scf::YieldOp::create(b, ValueRange{block});
  }
  ctaBarrier();
  return arith::IndexCastOp::create(
      b, indexTy, memref::LoadOp::create(b, broadcast, ValueRange{index(1)}));
}

/// Every CTA runs the instances of its slice of the precomputed queue:
/// queue[0 .. gridDim] are the slices' offsets; entries follow (and with
/// `sm-slices` the by-SM word: staticSlice).
LogicalResult KernelBuilder::buildStaticLoop(ArrayRef<DispatchOp> dispatches) {
  bool regions = llvm::any_of(
      dispatches, [](DispatchOp d) { return sharedRegion(d) != 0; });
  if (regions && prefetchNext)
    return graph.emitOpError(
        "prefetch-next runs every next entry's prefetch; with shared "
        "regions the schedule runs it ahead only across regions: use one");
  prefetchAhead = regions && llvm::any_of(dispatches, hasAheadPrefetch);
  if (prefetchAhead)
    for (DispatchOp dispatch : dispatches)
      if (dispatch.getPool())
        return dispatch.emitOpError(
            "is pooled, which runs its instances in a loop that a prefetch "
            "ahead across shared regions cannot follow: use one region");
  staticDispatches.assign(dispatches.begin(), dispatches.end());
  Value block =
      smSlices ? staticSlice() : gpu::BlockIdOp::create(b, gpu::Dimension::x);
  auto loadIndex = [&](Value at) {
    Value v = memref::LoadOp::create(b, queue, ValueRange{at});
    return arith::IndexCastOp::create(b, b.getIndexType(), v).getResult();
  };
  Value begin = loadIndex(block);
  Value end = loadIndex(arith::AddIOp::create(b, block, index(1)));
  // Loop-carried: the CTA is alive (no failed wait), with shared regions
  // whether this entry's prefetch already ran ahead, and whether the CTA saw
  // each cached wait complete.
  Type i1 = b.getI1Type();
  SmallVector<Value> inits{arith::ConstantIntOp::create(b, 1, 1)};
  if (prefetchAhead)
    inits.push_back(arith::ConstantIntOp::create(b, 0, 1));
  collectCachedWaits(dispatches);
  unsigned firstSeen = inits.size();
  for (size_t i = 0; i < cachedWaits.size(); ++i)
    inits.push_back(arith::ConstantIntOp::create(b, 0, 1));
  // The wait memo rides with the cached waits' flags (no key is -1).
  memoIndex = waitMemo ? static_cast<int>(cachedWaits.size()) : -1;
  if (waitMemo)
    inits.push_back(i64(-1));
  collectCachedTables(dispatches);
  unsigned firstTable = inits.size();
  ticketed.clear();
  for (DispatchOp dispatch : dispatches)
    if (dispatch.getTicket())
      ticketed.push_back(dispatch);
  for (size_t i = 0; i < cachedTables.size(); ++i) {
    inits.push_back(index(0)); // the entry, once loaded
    inits.push_back(arith::ConstantIntOp::create(b, 0, 1));
  }
  unsigned firstTicket = inits.size();
  for (size_t i = 0; i < ticketed.size(); ++i)
    inits.push_back(index(-1)); // no ticket drawn ahead
  SmallVector<Type> carried =
      llvm::map_to_vector(inits, [](Value v) { return v.getType(); });
  // With queue-ahead the loop also carries the entry at its position, loaded
  // an iteration early (an index inside the queue either way: an empty slice
  // loads word 0, unused).
  auto entryAt = [&](Value position, Value fallback) {
    Value in =
        arith::CmpIOp::create(b, arith::CmpIPredicate::ult, position, end);
    return memref::LoadOp::create(
               b, queue,
               ValueRange{arith::SelectOp::create(b, in, position, fallback)})
        .getResult();
  };
  SmallVector<Value> loopInits(inits);
  if (queueAhead)
    loopInits.push_back(entryAt(begin, index(0)));
  auto loop = scf::ForOp::create(b, begin, end, index(1), loopInits);
  {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(loop.getBody());
    Value alive = loop.getRegionIterArg(0);
    auto ifAlive = scf::IfOp::create(b, loop.getResultTypes(), alive, true);
    b.setInsertionPointToStart(ifAlive.elseBlock());
    scf::YieldOp::create(b, loop.getRegionIterArgs());
    b.setInsertionPointToStart(ifAlive.thenBlock());
    Value next = arith::AddIOp::create(b, loop.getInductionVar(), index(1));
    Value nextEntry =
        queueAhead ? entryAt(next, loop.getInductionVar()) : Value();
    if (prefetchNext)
      prefetchEntry(next, end, dispatches);
    nextPosition = next;
    sliceEnd = end;
    if (prefetchAhead)
      prefetchedAhead = loop.getRegionIterArg(1);
    loopSeen.assign(loop.getRegionIterArgs().begin() + firstSeen,
                    loop.getRegionIterArgs().begin() + firstTable);
    loopTableState.assign(loop.getRegionIterArgs().begin() + firstTable,
                          loop.getRegionIterArgs().begin() + firstTicket);
    loopTicketState.assign(loop.getRegionIterArgs().begin() + firstTicket,
                           loop.getRegionIterArgs().begin() + inits.size());
    Value entry = queueAhead ? loop.getRegionIterArgs().back()
                             : memref::LoadOp::create(
                                   b, queue, ValueRange{loop.getInductionVar()})
                                   .getResult();
    FailureOr<scf::IndexSwitchOp> sw = emitDispatchSwitch(
        entry, dispatches, carried,
        [&](DispatchOp dispatch, Value linear, Block *caseBlock) {
          if (dispatch.getPool())
            return lowerPooledDispatch(dispatch, linear, caseBlock);
          return lowerDispatch(dispatch, linear, caseBlock);
        });
    if (failed(sw))
      return failure();
    b.setInsertionPointAfter(*sw);
    SmallVector<Value> yielded((*sw).getResults());
    if (queueAhead)
      yielded.push_back(nextEntry);
    scf::YieldOp::create(b, yielded);
    b.setInsertionPointAfter(ifAlive);
    scf::YieldOp::create(b, ifAlive.getResults());
  }
  return success();
}

/// Before `current`'s waits: runs the prefetch of the CTA's next queue entry
/// when that entry's task is in another shared region (its shared memory is
/// apart from `current`'s, so its copies cannot overwrite what `current`
/// reads). Returns whether it ran, for the next iteration. The copies come
/// after `current`'s own: `cp.async.wait_group` in `current` then waits for
/// at most more groups than it counts, never fewer.
void KernelBuilder::prefetchAheadOf(DispatchOp current) {
  SmallVector<DispatchOp> ahead;
  for (DispatchOp dispatch : staticDispatches)
    if (hasAheadPrefetch(dispatch) &&
        sharedRegion(dispatch) != sharedRegion(current))
      ahead.push_back(dispatch);
  aheadRan = ahead.empty() || current.getTriggerEvent()
                 ? arith::ConstantIntOp::create(b, 0, 1).getResult()
                 : prefetchQueueEntry(nextPosition, sliceEnd, ahead,
                                      /*reportRan=*/true);
}

/// Instance `linear` of `dispatch`'s prefetch: its coordinates, buffer casts
/// and prefetch call (the body's leading hoistable ops), nothing else.
void KernelBuilder::clonePrefetch(DispatchOp dispatch, Value linear) {
  for (Operation &op : mapGridCoordinates(dispatch, linear)) {
    if (!isHoistable(op))
      break; // the waits: the prefetch call came before them
    b.clone(op, mapping);
  }
}

/// When `position` < `end`, runs the prefetch function of the queue entry
/// there: its coordinates, buffer casts and prefetch call, nothing else.
/// Tasks without a prefetch function (or with a trigger, whose coordinate
/// needs the indptr table) do nothing.
void KernelBuilder::prefetchEntry(Value position, Value end,
                                  ArrayRef<DispatchOp> dispatches) {
  SmallVector<DispatchOp> prefetching;
  for (DispatchOp dispatch : dispatches)
    if (hasAheadPrefetch(dispatch))
      prefetching.push_back(dispatch);
  if (!prefetching.empty())
    (void)prefetchQueueEntry(position, end, prefetching, /*reportRan=*/false);
}

/// When `position` < `end` and the queue entry there is an instance of one
/// of `candidates`, runs that instance's prefetch (`clonePrefetch`). With
/// `reportRan`, returns whether it did (i1); otherwise nothing.
Value KernelBuilder::prefetchQueueEntry(Value position, Value end,
                                        ArrayRef<DispatchOp> candidates,
                                        bool reportRan) {
  OpBuilder::InsertionGuard guard(b);
  Type i1 = b.getI1Type();
  TypeRange ran = reportRan ? TypeRange(i1) : TypeRange();
  Value inQueue =
      arith::CmpIOp::create(b, arith::CmpIPredicate::ult, position, end);
  auto ifNext = scf::IfOp::create(b, ran, inQueue, reportRan);
  if (reportRan) {
    b.setInsertionPointToStart(ifNext.elseBlock());
    scf::YieldOp::create(b, arith::ConstantIntOp::create(b, 0, 1).getResult());
  }
  b.setInsertionPointToStart(ifNext.thenBlock());
  Value entry = memref::LoadOp::create(b, queue, ValueRange{position});
  FailureOr<scf::IndexSwitchOp> sw = emitDispatchSwitch(
      entry, candidates, ran,
      [&](DispatchOp dispatch, Value linear, Block *caseBlock) {
        OpBuilder::InsertionGuard caseGuard(b);
        b.setInsertionPointToStart(caseBlock);
        clonePrefetch(dispatch, linear);
        if (reportRan)
          scf::YieldOp::create(
              b, arith::ConstantIntOp::create(b, 1, 1).getResult());
        else
          scf::YieldOp::create(b);
        return success();
      },
      /*othersAreCorrupt=*/false);
  if (!reportRan)
    return Value();
  scf::YieldOp::create(b, (*sw).getResult(0));
  return ifNext.getResult(0);
}

/// Decodes a task descriptor `task << 48 | instance` and switches on the
/// task to the case `lowerCase` fills for each dispatch. The switch yields
/// `resultTypes` (i1s: the static loop's "keep going" and "prefetched
/// ahead"; false in the default case) or nothing. With
/// `othersAreCorrupt`, an unknown task index means a corrupt queue: the
/// default case records it; without, the default case does nothing.
FailureOr<scf::IndexSwitchOp> KernelBuilder::emitDispatchSwitch(
    Value descriptor, ArrayRef<DispatchOp> dispatches, TypeRange resultTypes,
    function_ref<LogicalResult(DispatchOp, Value, Block *)> lowerCase,
    bool othersAreCorrupt) {
  Value task = arith::IndexCastOp::create(
      b, b.getIndexType(),
      arith::ShRUIOp::create(b, descriptor, i64(kInstanceBits)));
  Value linear = arith::IndexCastOp::create(
      b, b.getIndexType(),
      arith::AndIOp::create(b, descriptor, i64((1ll << kInstanceBits) - 1)));
  SmallVector<int64_t> cases = llvm::map_to_vector(
      dispatches, [](DispatchOp d) { return (int64_t)d.getTask(); });
  auto sw =
      scf::IndexSwitchOp::create(b, resultTypes, task, cases, cases.size());
  OpBuilder::InsertionGuard guard(b);
  for (auto [region, dispatch] : llvm::zip(sw.getCaseRegions(), dispatches))
    if (failed(lowerCase(dispatch, linear, b.createBlock(&region))))
      return failure();
  b.createBlock(&sw.getDefaultRegion());
  if (othersAreCorrupt) {
    memref::StoreOp::create(b, i32(2), status, ValueRange{index(kState)});
    memref::StoreOp::create(b, toI32(task), status, ValueRange{index(kTaskId)});
  }
  // A corrupt descriptor stops the CTA (the first result, `alive`, is false).
  SmallVector<Value> no = llvm::map_to_vector(resultTypes, [&](Type type) {
    return arith::ConstantOp::create(b, cast<TypedAttr>(b.getZeroAttr(type)))
        .getResult();
  });
  scf::YieldOp::create(b, no);
  return sw;
}

/// The last CTA to finish zeroes every counter (and the done counter at
/// index `total` after them), so a launch needs no host-side reset. Every
/// notification of this launch happened before its CTA's acq_rel increment
/// of the done counter, so the zeroing cannot race with one.
void KernelBuilder::resetCountersForNextLaunch() {
  Value total = countersEnd();
  ctaBarrier();
  Value doneAddr = addressOf(counters, total);
  Value gridSize = gpu::GridDimOp::create(b, gpu::Dimension::x);
  if (queueIsStatic && recordSM && !smSlices) {
    // The SM this CTA ran on, in the queue's last `gridDim` words, for the
    // runtime to deal later launches by (etc.runtime.queue.sm_deal). Here,
    // not before the loop: any instruction there changed ptxas's register
    // allocation of a whole inlined kernel (bench/RESULTS.md item 135). In
    // the queue, a buffer of this shape's own: after the counters it would
    // land on another shape's counters, which no launch zeroes.
    Value at = arith::AddIOp::create(
        b,
        arith::SubIOp::create(b, memref::DimOp::create(b, queue, index(0)),
                              gridSize),
        gpu::BlockIdOp::create(b, gpu::Dimension::x));
    OpBuilder::InsertionGuard guard(b);
    auto ifZero = scf::IfOp::create(b, TypeRange(), isThreadZero(), false);
    b.setInsertionPointToStart(ifZero.thenBlock());
    Value sm = arith::ExtUIOp::create(
        b, b.getI64Type(), asm32("mov.u32 $0, %smid;", "=r", ValueRange()));
    memref::StoreOp::create(b, sm, queue, ValueRange{at});
  }
  auto ifZero =
      scf::IfOp::create(b, b.getI32Type(), isThreadZero(), /*withElse=*/true);
  {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(ifZero.thenBlock());
    Value old =
        asm32("atom.acq_rel.gpu.global.add.u32 $0, [$1], 1;", "=r,l", doneAddr);
    Value last = arith::CmpIOp::create(
        b, arith::CmpIPredicate::eq, old,
        toI32(arith::SubIOp::create(b, gridSize, index(1))));
    scf::YieldOp::create(
        b, ValueRange{arith::ExtUIOp::create(b, b.getI32Type(), last)});
    b.setInsertionPointToStart(ifZero.elseBlock());
    scf::YieldOp::create(b, ValueRange{i32(0)});
  }
  Value anyLast = ctaReduce("or", ifZero.getResult(0));
  Value isLast =
      arith::CmpIOp::create(b, arith::CmpIPredicate::ne, anyLast, i32(0));
  auto ifLast = scf::IfOp::create(b, TypeRange(), isLast, false);
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPointToStart(ifLast.thenBlock());
  Value tid = gpu::ThreadIdOp::create(b, gpu::Dimension::x);
  Value threads = gpu::BlockDimOp::create(b, gpu::Dimension::x);
  // The checks read counters that other threads of this CTA zero below.
  if (checkCounts && checkTableCounts(tid, threads))
    ctaBarrier();
  Value end = arith::AddIOp::create(b, total, index(1));
  if (smSlices && queueIsStatic) // the SMs' CTA counts (staticSlice)
    end = arith::AddIOp::create(b, end, queueBySM().first);
  // The rank barrier's words survive (see waitForAllRanks).
  Value first =
      peers ? arith::AddIOp::create(b, tid, index(kRankBarrierWords)) : tid;
  auto zero = scf::ForOp::create(b, first, end, threads);
  {
    OpBuilder::InsertionGuard zeroGuard(b);
    b.setInsertionPointToStart(zero.getBody());
    memref::StoreOp::create(b, i32(0), counters,
                            ValueRange{zero.getInductionVar()});
  }
  if (peers) {
    // Ranked graphs: one more launch finished here (see waitForAllRanks).
    OpBuilder::InsertionGuard countGuard(b);
    auto ifZero = scf::IfOp::create(b, TypeRange(), isThreadZero(), false);
    b.setInsertionPointToStart(ifZero.thenBlock());
    asmVoid("red.relaxed.gpu.global.add.u32 [$0], 1;", "l",
            addressOf(counters, index(kLaunchesWord)));
  }
  if (!queueCapacity)
    return;
  // Dynamic schedule: head, tail and every ring slot that can be filled.
  Value queueEnd = arith::AddIOp::create(
      b, arith::SubIOp::create(b, queueCapacity, readyAtStart), index(kRing));
  auto zeroQueue = scf::ForOp::create(b, tid, queueEnd, threads);
  b.setInsertionPointToStart(zeroQueue.getBody());
  memref::StoreOp::create(b, i64(0), queue,
                          ValueRange{zeroQueue.getInductionVar()});
}

/// The last CTA, before it zeroes the counters: no coordinate of an event
/// whose wait counts come from a table may have received more notifications
/// than its count. The launch checks compare constant and symbolic counts
/// with the notifications; a table is data, and one entry too low released
/// the coordinate's waiters before its last producers finished, a race no
/// schedule orders (state 5, the first such coordinate). Every notification
/// happened before the done counter's acq_rel add that chose this CTA. Graphs
/// without such events get no code. Returns whether it checked any (the
/// caller then joins the CTA before the zeroing: without that barrier, a
/// thread zeroed a counter before another read it, and no check fired on
/// the H200).
bool KernelBuilder::checkTableCounts(Value tid, Value threads) {
  bool checked = false;
  for (auto event : graph.getBodyBlock().getOps<EventOp>()) {
    EventInfo &info = events[event.getEvent()];
    if (!info.table || info.ranked)
      continue;
    // A function of its own that the kernel calls (no_inline): code inlined
    // at the exit moved ptxas's allocation of a whole inlined kernel (the
    // MoE prefill kernel spilled 176 bytes instead of 16).
    SmallVector<Value> args{counters,  status, info.table,
                            info.base, tid,    threads};
    llvm::append_range(args, info.sizes);
    auto type = FunctionType::get(b.getContext(), ValueRange(args).getTypes(),
                                  TypeRange());
    OpBuilder moduleBuilder(kernel);
    auto fn = func::FuncOp::create(
        moduleBuilder, kernel.getLoc(),
        ("__etc_check_counts_" + Twine(info.id)).str(), type);
    fn.setPrivate();
    Block *entry = fn.addEntryBlock();
    {
      OpBuilder::InsertionGuard guard(b);
      b.setInsertionPointToStart(entry);
      // The helpers below read the kernel's buffers from these members.
      EventInfo local = info;
      Value kernelCounters = counters, kernelStatus = status;
      counters = entry->getArgument(0);
      status = entry->getArgument(1);
      local.table = entry->getArgument(2);
      local.base = entry->getArgument(3);
      local.sizes.assign(entry->args_begin() + 6, entry->args_end());
      Value coordinates = index(1);
      for (Value size : local.sizes)
        coordinates = arith::MulIOp::create(b, coordinates, size);
      auto loop = scf::ForOp::create(b, entry->getArgument(4), coordinates,
                                     entry->getArgument(5));
      {
        OpBuilder::InsertionGuard loopGuard(b);
        b.setInsertionPointToStart(loop.getBody());
        Value c = loop.getInductionVar();
        Value counter =
            asm32("ld.relaxed.gpu.global.u32 $0, [$1];", "=r,l",
                  addressOf(counters, arith::AddIOp::create(b, local.base, c)));
        Value count = waitCount(local, delinearize(c, local.sizes));
        Value exceeded =
            arith::CmpIOp::create(b, arith::CmpIPredicate::sgt, counter, count);
        auto ifExceeded = scf::IfOp::create(b, TypeRange(), exceeded, false);
        b.setInsertionPointToStart(ifExceeded.thenBlock());
        recordFailure(kCountExceeded, {{kEventId, i32(info.id)},
                                       {kTaskId, i32(-1)},
                                       {kCoordinate, c},
                                       {kCounter, counter},
                                       {kWaitCount, count},
                                       {kInstance, i32(-1)}});
      }
      func::ReturnOp::create(b);
      counters = kernelCounters;
      status = kernelStatus;
    }
    func::CallOp::create(b, fn, args).setNoInline(true);
    checked = true;
  }
  return checked;
}

/// The rank barrier of a ranked graph. Two words precede the events' counters
/// and are never reset: `launches` (launches this rank finished) and
/// `arrivals` (arrivals of every rank, all launches). CTA 0 adds one to each
/// rank's `arrivals` (system-scope release); every CTA then waits until its own
/// reaches ranks * (launches + 1). A rank thereby starts this launch's
/// notifications and peer writes only once every rank has finished the
/// previous launch (reset its counters, consumed its peer-written buffers)
/// and has started this one (its stream's earlier work, its inputs, is
/// done). The watchdog reports a rank that never launches as event -2.
/// Returns an i1, true (uniform) when every rank arrived.
Value KernelBuilder::waitForAllRanks() {
  Value arrivals = index(kArrivalsWord);
  Value ranks = memref::DimOp::create(b, peers, index(0));
  Value block = gpu::BlockIdOp::create(b, gpu::Dimension::x);
  Value first = arith::AndIOp::create(
      b, isThreadZero(),
      arith::CmpIOp::create(b, arith::CmpIPredicate::eq, block, index(0)));
  {
    OpBuilder::InsertionGuard guard(b);
    auto ifFirst = scf::IfOp::create(b, TypeRange(), first, false);
    b.setInsertionPointToStart(ifFirst.thenBlock());
    auto each = scf::ForOp::create(b, index(0), ranks, index(1));
    b.setInsertionPointToStart(each.getBody());
    asmVoid("red.release.sys.global.add.u32 [$0], 1;", "l",
            peerCounterAddress(each.getInductionVar(), arrivals));
  }
  EventInfo barrier;
  barrier.id = -2;
  barrier.base = arrivals;
  barrier.ranked = true;
  auto ifZero = scf::IfOp::create(b, b.getI32Type(), isThreadZero(),
                                  /*withElseRegion=*/true);
  {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(ifZero.thenBlock());
    Value launches = asm32("ld.relaxed.gpu.global.u32 $0, [$1];", "=r,l",
                           addressOf(counters, index(kLaunchesWord)));
    Value target = arith::MulIOp::create(
        b, toI32(ranks), arith::AddIOp::create(b, launches, i32(1)));
    scf::YieldOp::create(b, pollCounter(barrier, index(0), target,
                                        /*taskId=*/-1, index(0)));
    b.setInsertionPointToStart(ifZero.elseBlock());
    scf::YieldOp::create(b, ValueRange{i32(0)});
  }
  return noneFailed(ifZero.getResult(0));
}

static bool isPTXIdentifier(StringRef name) {
  auto isFollow = [](char c) {
    return llvm::isAlnum(c) || c == '_' || c == '$';
  };
  return !name.empty() && !llvm::isDigit(name.front()) &&
         llvm::all_of(name, isFollow);
}

/// Whether an alloca in `space` can lower: NVPTX stack slots live in the
/// generic or the local (gpu private, 5) address space only.
static bool isWorkgroupMemorySpace(Attribute space) {
  if (auto gpuSpace = dyn_cast_if_present<gpu::AddressSpaceAttr>(space))
    return gpuSpace.getValue() == gpu::AddressSpace::Workgroup;
  if (auto number = dyn_cast_if_present<IntegerAttr>(space))
    return number.getInt() == 3;
  return false;
}

/// The bytes of a statically shaped memref.
static int64_t byteSize(MemRefType type) {
  return type.getNumElements() *
         llvm::divideCeil(type.getElementTypeBitWidth(), 8);
}

/// The tiles of a persistent kernel run one at a time on a CTA, which joins
/// (a barrier) after each instance: their workgroup buffers can share
/// memory. Places every workgroup memref.global of `module` at an offset in
/// one byte buffer, apart from the globals that a function (with its
/// callees) uses together, and reads each through a memref.view: the kernel
/// needs the largest tile's shared memory, not the sum. A buffer past
/// `kStaticSharedBytes` becomes dynamic shared memory (`extern .shared`): its
/// size goes on `kernel` as `etensor.dynamic_shared_memory`, for the launch.
/// `regionOf` maps the functions that tasks call (tile and prefetch) to
/// their shared region: the globals of different regions never overlap, so
/// a prefetch run ahead cannot write what the current tile reads.
static LogicalResult
overlayWorkgroupGlobals(gpu::GPUModuleOp module, gpu::GPUFuncOp kernel,
                        const llvm::StringMap<int64_t> &regionOf) {
  SmallVector<memref::GlobalOp> globals;
  for (auto global : module.getOps<memref::GlobalOp>())
    if (isWorkgroupMemorySpace(global.getType().getMemorySpace()))
      globals.push_back(global);
  if (globals.empty())
    return success();
  DenseMap<StringAttr, unsigned> indexOf;
  for (auto [k, global] : llvm::enumerate(globals)) {
    MemRefType type = global.getType();
    if (!type.hasStaticShape() || !type.getLayout().isIdentity() ||
        !type.getElementType().isIntOrFloat())
      return global.emitOpError("workgroup global must have a static shape, "
                                "an identity layout and int/float elements");
    indexOf[global.getSymNameAttr()] = k;
  }
  // Globals each function uses, directly or through the functions it calls.
  DenseMap<Operation *, llvm::SmallDenseSet<unsigned>> direct;
  DenseMap<Operation *, SmallVector<Operation *>> calls;
  SymbolTable symbols(module);
  for (auto fn : module.getOps<func::FuncOp>())
    fn.walk([&](Operation *op) {
      if (auto get = dyn_cast<memref::GetGlobalOp>(op)) {
        auto it = indexOf.find(get.getNameAttr().getAttr());
        if (it != indexOf.end())
          direct[fn].insert(it->second);
      } else if (auto call = dyn_cast<func::CallOp>(op)) {
        if (Operation *callee = symbols.lookup(call.getCallee()))
          calls[fn].push_back(callee);
      }
    });
  unsigned n = globals.size();
  SmallVector<llvm::SmallBitVector> together(n, llvm::SmallBitVector(n));
  // Each global's region (-1: no task function reaches it yet).
  SmallVector<int64_t> regionOfGlobal(n, -1);
  for (auto fn : module.getOps<func::FuncOp>()) {
    llvm::SmallDenseSet<unsigned> used;
    llvm::SmallPtrSet<Operation *, 8> seen{fn};
    SmallVector<Operation *> work{fn};
    while (!work.empty()) {
      Operation *f = work.pop_back_val();
      used.insert(direct[f].begin(), direct[f].end());
      for (Operation *callee : calls[f])
        if (seen.insert(callee).second)
          work.push_back(callee);
    }
    for (unsigned a : used)
      for (unsigned b : used)
        together[a].set(b);
    auto region = regionOf.find(fn.getSymName());
    if (region == regionOf.end())
      continue;
    for (unsigned a : used) {
      if (regionOfGlobal[a] >= 0 && regionOfGlobal[a] != region->second)
        return globals[a].emitOpError("'")
               << globals[a].getSymName() << "' is used by tasks in shared "
               << "regions " << regionOfGlobal[a] << " and " << region->second
               << " (through '" << fn.getSymName()
               << "'): a buffer belongs to one region";
      regionOfGlobal[a] = region->second;
    }
  }
  // Regions are laid out one after the other, each overlaid within itself
  // by first fit in declaration order (globals no task reaches: region 0).
  std::map<int64_t, SmallVector<unsigned>> byRegion;
  SmallVector<unsigned> kernelWords;
  for (unsigned k = 0; k < n; ++k) {
    if (globals[k]->hasAttr(kKernelWordsAttrName))
      kernelWords.push_back(k);
    else
      byRegion[std::max<int64_t>(regionOfGlobal[k], 0)].push_back(k);
  }
  SmallVector<int64_t> offset(n), size(n);
  // Behind the kernel's own `.shared` words the buffer starts on a 128-byte
  // line at least (at 16 bytes, the decoder's B = 1 kernel took 20 % longer).
  int64_t total = 0,
          maxAlign = kernel.getWorkgroupAttributions().empty() ? 16 : 128;
  for (auto &[region, members] : byRegion) {
    int64_t base = total;
    for (auto [rank, k] : llvm::enumerate(members)) {
      size[k] = byteSize(globals[k].getType());
      int64_t align =
          std::max<int64_t>(16, globals[k].getAlignment().value_or(16));
      maxAlign = std::max(maxAlign, align);
      int64_t at = llvm::alignTo(base, align);
      for (bool moved = true; moved;) {
        moved = false;
        for (unsigned j : ArrayRef<unsigned>(members).take_front(rank))
          if (together[k][j] && at < offset[j] + size[j] &&
              offset[j] < at + size[k]) {
            at = llvm::alignTo(offset[j] + size[j], align);
            moved = true;
          }
      }
      offset[k] = at;
      total = std::max(total, at + size[k]);
    }
  }
  // The kernel's own words, which every instance may use: apart, at the end.
  for (unsigned k : kernelWords) {
    size[k] = byteSize(globals[k].getType());
    offset[k] = llvm::alignTo(total, 16);
    total = offset[k] + size[k];
  }
  OpBuilder builder(globals.front());
  MLIRContext *ctx = module.getContext();
  // Static shared memory stops at 48 KiB; the kernel keeps some for itself.
  bool dynamic = total > kStaticSharedBytes;
  auto bufferType = MemRefType::get(
      {dynamic ? 0 : std::max<int64_t>(total, 1)}, IntegerType::get(ctx, 8),
      AffineMap(),
      gpu::AddressSpaceAttr::get(ctx, gpu::AddressSpace::Workgroup));
  // Dynamic: an external, unsized declaration (`.extern .shared`).
  auto buffer = memref::GlobalOp::create(
      builder, globals.front().getLoc(), "__etc_workgroup",
      builder.getStringAttr(dynamic ? "public" : "private"), bufferType,
      Attribute(), /*constant=*/false, builder.getI64IntegerAttr(maxAlign));
  if (dynamic) {
    if (total > kMaxSharedBytes)
      return kernel.emitOpError("needs ")
             << total << " bytes of shared memory for its tiles, over the "
             << kMaxSharedBytes << " an sm_90 CTA can have";
    kernel->setAttr("etensor.dynamic_shared_memory",
                    builder.getI64IntegerAttr(total));
  }
  symbols.insert(buffer);
  SmallVector<memref::GetGlobalOp> uses;
  module.walk([&](memref::GetGlobalOp get) {
    if (indexOf.count(get.getNameAttr().getAttr()))
      uses.push_back(get);
  });
  for (memref::GetGlobalOp get : uses) {
    unsigned k = indexOf[get.getNameAttr().getAttr()];
    builder.setInsertionPoint(get);
    Value base = memref::GetGlobalOp::create(builder, get.getLoc(), bufferType,
                                             buffer.getSymName());
    Value shift =
        arith::ConstantIndexOp::create(builder, get.getLoc(), offset[k]);
    Value view = memref::ViewOp::create(builder, get.getLoc(), get.getType(),
                                        base, shift, ValueRange());
    get.replaceAllUsesWith(view);
    get.erase();
  }
  for (memref::GlobalOp global : globals)
    global.erase();
  return success();
}

static bool isStackMemorySpace(Attribute space) {
  if (!space)
    return true;
  if (auto gpuSpace = dyn_cast<gpu::AddressSpaceAttr>(space))
    return gpuSpace.getValue() == gpu::AddressSpace::Private;
  if (auto number = dyn_cast<IntegerAttr>(space))
    return number.getInt() == 0 || number.getInt() == 5;
  return false;
}

/// Thread 0 appends `[start, now, task << 48 | instance, smid << 32 | cta]`
/// to the trace buffer; records past its capacity are counted, not written.
void KernelBuilder::recordTrace(Value start, int64_t task, Value linear) {
  auto ifZero = scf::IfOp::create(b, TypeRange(), isThreadZero(), false);
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPointToStart(ifZero.thenBlock());
  Value end = globalTimer();
  Value base =
      toI64(memref::ExtractAlignedPointerAsIndexOp::create(b, traceBuffer));
  Value slot = arith::IndexCastOp::create(
      b, b.getIndexType(),
      asm64("atom.relaxed.gpu.global.add.u64 $0, [$1], 1;", "=l,l", base));
  Value words = memref::DimOp::create(b, traceBuffer, index(0));
  Value capacity = arith::DivUIOp::create(
      b, arith::SubIOp::create(b, words, index(1)), index(4));
  auto ifRoom = scf::IfOp::create(
      b, TypeRange(),
      arith::CmpIOp::create(b, arith::CmpIPredicate::ult, slot, capacity),
      false);
  b.setInsertionPointToStart(ifRoom.thenBlock());
  Value first = arith::AddIOp::create(
      b, arith::MulIOp::create(b, slot, index(4)), index(1));
  Value sm = arith::ExtUIOp::create(
      b, b.getI64Type(), asm32("mov.u32 $0, %smid;", "=r", ValueRange()));
  Value cta = toI64(gpu::BlockIdOp::create(b, gpu::Dimension::x));
  Value fields[] = {
      start, end,
      arith::OrIOp::create(b, i64(task << kInstanceBits), toI64(linear)),
      arith::OrIOp::create(b, arith::ShLIOp::create(b, sm, i64(32)), cta)};
  for (auto [k, value] : llvm::enumerate(fields))
    memref::StoreOp::create(
        b, value, traceBuffer,
        ValueRange{arith::AddIOp::create(b, first, index(k))});
}

/// The wait count of `coords` as an i32: constant, symbolic or loaded.
Value KernelBuilder::waitCount(EventInfo &info, ValueRange coords) {
  if (!info.table)
    return toI32(info.waitCount);
  Value raw = memref::LoadOp::create(b, info.table, coords);
  return arith::IndexCastOp::create(
      b, b.getI32Type(), arith::IndexCastOp::create(b, b.getIndexType(), raw));
}

SmallVector<Value> KernelBuilder::gridExtents(DispatchOp dispatch) {
  SmallVector<Value> extents;
  for (OpFoldResult extent : dispatch.getMixedGrid())
    extents.push_back(
        isa<Attribute>(extent)
            ? index(cast<IntegerAttr>(cast<Attribute>(extent)).getInt())
            : mapping.lookup(cast<Value>(extent)));
  return extents;
}

/// Thread 0 claims the next queue position. Positions below the number of
/// instances ready at start name those instances directly (task by task, in
/// linear order: no push needed); later ones are ring slots that a pusher
/// fills, polled with acquire loads under the watchdog. Returns the task
/// descriptor `task << 48 | instance`, or -1 when the CTA must exit (all
/// instances claimed, or a failure recorded anywhere). Uniform over the CTA.
Value KernelBuilder::pop(ArrayRef<DispatchOp> dispatches, Claim &claim) {
  Value stateAddr = addressOf(status, index(kState));
  Value exit = i64(-1);
  Type i64Ty = b.getI64Type(), indexTy = b.getIndexType();
  auto ifZero = scf::IfOp::create(b, TypeRange{i64Ty, i64Ty, indexTy, indexTy},
                                  isThreadZero(), true);
  {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(ifZero.elseBlock());
    scf::YieldOp::create(
        b, ValueRange{exit, claim.pending, claim.next, claim.end});
    b.setInsertionPointToStart(ifZero.thenBlock());
    // Take the next position of the current chunk, or start the pending
    // chunk and request the one after it: the request's latency overlaps
    // the task this position runs, and chunks cut contention on the head.
    // Without pop-ahead the chunk is requested here, when the CTA is free:
    // a position is never held by a CTA still running an earlier instance.
    Value haveLocal = arith::CmpIOp::create(b, arith::CmpIPredicate::ult,
                                            claim.next, claim.end);
    auto ifRequest = scf::IfOp::create(b, i64Ty, haveLocal, true);
    {
      OpBuilder::InsertionGuard requestGuard(b);
      b.setInsertionPointToStart(ifRequest.thenBlock());
      scf::YieldOp::create(b, claim.pending);
      b.setInsertionPointToStart(ifRequest.elseBlock());
      scf::YieldOp::create(b, requestChunk());
    }
    Value chunkStart = popAhead ? claim.pending : ifRequest.getResult(0);
    Value pendingStart = arith::IndexCastOp::create(b, indexTy, chunkStart);
    Value position =
        arith::SelectOp::create(b, haveLocal, claim.next, pendingStart);
    Value nextEnd = arith::SelectOp::create(
        b, haveLocal, claim.end,
        arith::AddIOp::create(b, pendingStart, chunkSize));
    Value total = liveTotal();
    Value done =
        arith::CmpIOp::create(b, arith::CmpIPredicate::uge, position, total);
    auto ifDone = scf::IfOp::create(b, b.getI64Type(), done, true);
    scf::YieldOp::create(
        b, ValueRange{ifDone.getResult(0), ifRequest.getResult(0),
                      arith::AddIOp::create(b, position, index(1)), nextEnd});
    b.setInsertionPointToStart(ifDone.thenBlock());
    scf::YieldOp::create(b, exit);
    b.setInsertionPointToStart(ifDone.elseBlock());
    Value initial = arith::CmpIOp::create(b, arith::CmpIPredicate::ult,
                                          position, readyAtStart);
    auto ifInitial = scf::IfOp::create(b, b.getI64Type(), initial, true);
    scf::YieldOp::create(b, ifInitial.getResult(0));
    {
      // A ready-at-start instance: find its task by the running counts.
      OpBuilder::InsertionGuard initialGuard(b);
      b.setInsertionPointToStart(ifInitial.thenBlock());
      Value descriptor = exit, before = index(0);
      for (auto [dispatch, count] : llvm::zip(dispatches, instanceCounts)) {
        if (!dispatch->hasAttr("etensor.ready_at_start"))
          continue;
        Value after = arith::AddIOp::create(b, before, count);
        Value inside = arith::AndIOp::create(
            b,
            arith::CmpIOp::create(b, arith::CmpIPredicate::uge, position,
                                  before),
            arith::CmpIOp::create(b, arith::CmpIPredicate::ult, position,
                                  after));
        Value candidate = arith::OrIOp::create(
            b, i64(int64_t(DispatchOp(dispatch).getTask()) << kInstanceBits),
            toI64(arith::SubIOp::create(b, position, before)));
        descriptor = arith::SelectOp::create(b, inside, candidate, descriptor);
        before = after;
      }
      scf::YieldOp::create(b, descriptor);
    }
    // A pushed instance: poll its ring slot.
    b.setInsertionPointToStart(ifInitial.elseBlock());
    Value slot = arith::SubIOp::create(b, position, readyAtStart);
    Value slotAddr = queueAddress(arith::AddIOp::create(b, slot, index(kRing)));
    Type i64Ty = b.getI64Type(), i32Ty = b.getI32Type();
    auto loop =
        scf::WhileOp::create(b, TypeRange{i64Ty, i64Ty, i32Ty},
                             ValueRange{i64(0), i64(0), i32(kFirstSleepNs)});
    {
      OpBuilder::InsertionGuard loopGuard(b);
      Block *before =
          b.createBlock(&loop.getBefore(), {}, {i64Ty, i64Ty, i32Ty},
                        {b.getLoc(), b.getLoc(), b.getLoc()});
      b.setInsertionPointToStart(before);
      Value value =
          asm64("ld.acquire.gpu.global.u64 $0, [$1];", "=l,l", slotAddr);
      Value filled =
          arith::CmpIOp::create(b, arith::CmpIPredicate::ne, value, i64(0));
      Value polledState =
          asm32("ld.relaxed.gpu.global.u32 $0, [$1];", "=r,l", stateAddr);
      Value aborted = arith::CmpIOp::create(b, arith::CmpIPredicate::ne,
                                            polledState, i32(0));
      Value expired =
          arith::CmpIOp::create(b, arith::CmpIPredicate::sge,
                                before->getArgument(1), toI64(maxPolls));
      // A retirement may put this position past the end: nobody fills it.
      Value retired = arith::CmpIOp::create(b, arith::CmpIPredicate::uge,
                                            position, liveTotal());
      Value stop =
          arith::OrIOp::create(b, arith::OrIOp::create(b, filled, retired),
                               arith::OrIOp::create(b, aborted, expired));
      scf::ConditionOp::create(
          b,
          arith::XOrIOp::create(b, stop, arith::ConstantIntOp::create(b, 1, 1)),
          ValueRange{value, before->getArgument(1), before->getArgument(2)});
      Block *after = b.createBlock(&loop.getAfter(), {}, {i64Ty, i64Ty, i32Ty},
                                   {b.getLoc(), b.getLoc(), b.getLoc()});
      b.setInsertionPointToStart(after);
      asmVoid("nanosleep.u32 $0;", "r", after->getArgument(2));
      Value sleep = arith::MinUIOp::create(
          b, arith::ShLIOp::create(b, after->getArgument(2), i32(1)),
          i32(kMaxSleepNs));
      scf::YieldOp::create(
          b, ValueRange{i64(0),
                        arith::AddIOp::create(b, after->getArgument(1), i64(1)),
                        sleep});
    }
    Value value = loop.getResult(0);
    Value filled =
        arith::CmpIOp::create(b, arith::CmpIPredicate::ne, value, i64(0));
    Value expired = arith::CmpIOp::create(b, arith::CmpIPredicate::sge,
                                          loop.getResult(1), toI64(maxPolls));
    Value report = arith::AndIOp::create(
        b, expired,
        arith::XOrIOp::create(b, filled,
                              arith::ConstantIntOp::create(b, 1, 1)));
    auto ifReport = scf::IfOp::create(b, TypeRange(), report, false);
    {
      OpBuilder::InsertionGuard reportGuard(b);
      b.setInsertionPointToStart(ifReport.thenBlock());
      // No event: the CTA waited for a task that was never pushed.
      recordFailure(kWatchdog,
                    {{kEventId, i32(-1)},
                     {kTaskId, i32(-1)},
                     {kCounter, position},
                     {kWaitCount, total},
                     {kInstance, i32(-1)},
                     {kBlock, Value()},
                     {kCoordinate, i32(-1)}},
                    stateAddr);
    }
    // Pushed descriptors carry task + 1 so that zero means "empty".
    Value descriptor =
        arith::SubIOp::create(b, value, i64(int64_t(1) << kInstanceBits));
    scf::YieldOp::create(
        b, arith::SelectOp::create(b, filled, descriptor, exit).getResult());
  }
  // Broadcast to the CTA. Thread 0 rewrites the slot only at its next pop,
  // after the task's closing barrier, when every thread has read it.
  auto ifWriter = scf::IfOp::create(b, TypeRange(), isThreadZero(), false);
  {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(ifWriter.thenBlock());
    memref::StoreOp::create(b, ifZero.getResult(0), broadcast,
                            ValueRange{index(0)});
  }
  ctaBarrier();
  claim = {ifZero.getResult(1), ifZero.getResult(2), ifZero.getResult(3)};
  return memref::LoadOp::create(b, broadcast, ValueRange{index(0)});
}

/// Thread 0 requests `chunkSize` queue positions; returns the first.
Value KernelBuilder::requestChunk() {
  return asm64("atom.relaxed.gpu.global.add.u64 $0, [$1], $2;", "=l,l,l",
               ValueRange{queueAddress(index(kHead)), toI64(chunkSize)});
}

/// The dynamic worker: pop, run, repeat until pop says exit.
LogicalResult KernelBuilder::buildDynamicLoop(ArrayRef<DispatchOp> dispatches) {
  if (!queueCapacity)
    return graph.emitOpError("a dynamic worker needs an etensor.queue");
  // Positions per head request: 1 unless many instances are ready at start
  // (then up to max-pop-chunk, keeping at least 4 chunks per CTA).
  Value grid = gpu::GridDimOp::create(b, gpu::Dimension::x);
  chunkSize = arith::MinUIOp::create(
      b,
      arith::MaxUIOp::create(
          b,
          arith::DivUIOp::create(b, readyAtStart,
                                 arith::MulIOp::create(b, grid, index(4))),
          index(1)),
      index(maxPopChunk));
  Type i64Ty = b.getI64Type(), indexTy = b.getIndexType();
  auto first = scf::IfOp::create(b, i64Ty, isThreadZero(), true);
  {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(first.thenBlock());
    scf::YieldOp::create(b, popAhead ? requestChunk() : i64(0));
    b.setInsertionPointToStart(first.elseBlock());
    scf::YieldOp::create(b, i64(0));
  }
  SmallVector<Type> claimTypes{i64Ty, indexTy, indexTy};
  SmallVector<Location> claimLocs(3, b.getLoc());
  auto loop = scf::WhileOp::create(
      b, claimTypes, ValueRange{first.getResult(0), index(0), index(0)});
  Block *before = b.createBlock(&loop.getBefore(), {}, claimTypes, claimLocs);
  b.setInsertionPointToStart(before);
  Claim claim{before->getArgument(0), before->getArgument(1),
              before->getArgument(2)};
  Value descriptor = pop(dispatches, claim);
  Value alive =
      arith::CmpIOp::create(b, arith::CmpIPredicate::ne, descriptor, i64(-1));
  auto ifAlive = scf::IfOp::create(b, TypeRange(), alive, false);
  {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(ifAlive.thenBlock());
    if (failed(emitDispatchSwitch(
            descriptor, dispatches, /*resultTypes=*/TypeRange(),
            [&](DispatchOp dispatch, Value linear, Block *caseBlock) {
              return lowerDynamicDispatch(dispatch, linear, caseBlock);
            })))
      return failure();
  }
  scf::ConditionOp::create(b, alive,
                           ValueRange{claim.pending, claim.next, claim.end});
  Block *after = b.createBlock(&loop.getAfter(), {}, claimTypes, claimLocs);
  b.setInsertionPointToStart(after);
  scf::YieldOp::create(b, after->getArguments());
  b.setInsertionPointAfter(loop);
  return success();
}

/// One dynamic task instance: the early pushes (thread 0), the waits (the
/// CTA), the body, then a barrier and the notifications and pushes (thread
/// 0). Pushes publish the whole CTA's writes: barrier, then release.
LogicalResult KernelBuilder::lowerDynamicDispatch(DispatchOp dispatch,
                                                  Value linear, Block *into) {
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPointToStart(into);
  Block &body = mapGridCoordinates(dispatch, linear);
  // Only instances below indptr[C] are ever pushed, and only once the table
  // is final, so the count finds the range the instance was pushed from;
  // where it does not, the table decreases somewhere (a range the pushes
  // checked may still overlap another): the instance is reported, not run.
  Value inRange = arith::ConstantIntOp::create(b, 1, 1);
  if (dispatch.getTriggerEvent()) {
    Value valid, begin, end;
    Value coordinate = findTriggerCoordinate(dispatch, linear, valid);
    mapping.map(body.getArgument(1), coordinate);
    inRange = insideRange(dispatch, coordinate, linear, begin, end);
    auto ifOutside = scf::IfOp::create(
        b, TypeRange(),
        arith::AndIOp::create(
            b, isThreadZero(),
            arith::XOrIOp::create(b, inRange,
                                  arith::ConstantIntOp::create(b, 1, 1))),
        false);
    OpBuilder::InsertionGuard outsideGuard(b);
    b.setInsertionPointToStart(ifOutside.thenBlock());
    recordInstanceOutsideRange(dispatch.getTask(), coordinate, begin, end,
                               linear);
  }

  SmallVector<Operation *> before, waits, bodyOps, after;
  bool seenBody = false;
  for (Operation &op : body.without_terminator()) {
    // A prefetch placed after waits (prefetch_after) stays among them.
    if (!seenBody && !waits.empty() && isa<func::CallOp>(op) &&
        op.hasAttr(kPrefetchAttrName)) {
      waits.push_back(&op);
      continue;
    }
    // Edge-map arithmetic runs on every thread: waits and thread 0 use it.
    if (!seenBody && isHoistable(op)) {
      b.clone(op, mapping);
      continue;
    }
    if (isa<WaitOp>(op)) {
      if (seenBody)
        return op.emitOpError("must come before the task body");
      waits.push_back(&op);
    } else if (isa<func::CallOp>(op)) {
      seenBody = true;
      bodyOps.push_back(&op);
    } else if (seenBody) {
      after.push_back(&op);
    } else if (waits.empty()) {
      before.push_back(&op);
    } else {
      return op.emitOpError("may not come between the waits and the task "
                            "body");
    }
  }
  if (failed(emitThreadZero(before)))
    return failure();
  Value ok = inRange;
  for (Operation *op : waits) {
    if (auto wait = dyn_cast<WaitOp>(op)) {
      ok = arith::AndIOp::create(b, ok,
                                 lowerWait(wait, dispatch.getTask(), linear));
      continue;
    }
    // The prefetch reads what the waits before it guard: only past them.
    auto ifWaited = scf::IfOp::create(b, TypeRange(), ok, false);
    OpBuilder::InsertionGuard prefetchGuard(b);
    b.setInsertionPointToStart(ifWaited.thenBlock());
    b.clone(*op, mapping);
  }
  auto ifOk = scf::IfOp::create(b, TypeRange(), ok, false);
  b.setInsertionPointToStart(ifOk.thenBlock());
  Value start = traceBuffer ? globalTimer() : Value();
  for (Operation *op : bodyOps)
    b.clone(*op, mapping);
  ctaBarrier();
  if (traceBuffer)
    recordTrace(start, dispatch.getTaskAttr().getInt(), linear);
  if (failed(emitThreadZero(after)))
    return failure();
  b.setInsertionPointAfter(ifOk);
  scf::YieldOp::create(b);
  return success();
}

/// Clones `ops` under `if (threadIdx.x == 0)` and lowers the etensor ops
/// among them to thread-local atomics.
LogicalResult KernelBuilder::emitThreadZero(ArrayRef<Operation *> ops) {
  if (ops.empty())
    return success();
  auto ifZero = scf::IfOp::create(b, TypeRange(), isThreadZero(), false);
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPointToStart(ifZero.thenBlock());
  for (Operation *op : ops)
    b.clone(*op, mapping);
  SmallVector<Operation *> etensorOps;
  WalkResult walk = ifZero.walk([&](Operation *op) {
    if (isa<NotifyOp, PushOp, RetireOp, CheckRangeOp>(op)) {
      etensorOps.push_back(op);
      return WalkResult::advance();
    }
    if (op->getDialect() && isa<ETensorDialect>(op->getDialect())) {
      op->emitOpError("cannot run in the notify/push section of a dynamic "
                      "task");
      return WalkResult::interrupt();
    }
    return WalkResult::advance();
  });
  if (walk.wasInterrupted())
    return failure();
  // Range pushes: thread 0 claims the slots, the whole CTA writes them. A
  // push under thread 0's conditions (scf.if only: one record each) leaves
  // a count of zero when it does not run.
  auto underIfsOnly = [&](Operation *op) {
    for (Operation *p = op->getParentOp(); p != ifZero.getOperation();
         p = p->getParentOp())
      if (!isa<scf::IfOp>(p))
        return false;
    return true;
  };
  // Fan-out loops leave thread 0 (their etensor ops with them): thread 0
  // only records whether each runs and with which values.
  auto fanOuts = takeFanOuts(ifZero, underIfsOnly);
  llvm::erase_if(etensorOps, [&](Operation *op) {
    return llvm::any_of(
        fanOuts, [&](auto &fanOut) { return fanOut.first->isAncestor(op); });
  });
  DenseMap<Operation *, int64_t> recordOf;
  SmallVector<int64_t> ranged; // task of each record
  for (Operation *op : etensorOps)
    if (auto push = dyn_cast<PushOp>(op))
      if (push.getCount() && pushRecords &&
          (int64_t)ranged.size() < kMaxRangePushes && underIfsOnly(op)) {
        recordOf[op] = ranged.size();
        ranged.push_back(push.getTaskAttr().getInt());
      }
  b.setInsertionPointToStart(ifZero.thenBlock());
  for (int64_t record = 0; record < (int64_t)ranged.size(); ++record)
    memref::StoreOp::create(b, i64(0), pushRecords,
                            ValueRange{index(3 * record + 2)});
  for (Operation *op : etensorOps) {
    b.setInsertionPoint(op);
    if (auto notify = dyn_cast<NotifyOp>(op))
      lowerThreadNotify(notify);
    else if (auto retire = dyn_cast<RetireOp>(op))
      lowerThreadRetire(retire);
    else if (auto check = dyn_cast<CheckRangeOp>(op))
      lowerThreadCheckRange(check);
    else if (recordOf.count(op))
      reserveRangePush(cast<PushOp>(op), recordOf[op]);
    else
      lowerThreadPush(cast<PushOp>(op));
    op->erase();
  }
  if (ranged.empty() && fanOuts.empty())
    return success();
  b.setInsertionPointAfter(ifZero);
  ctaBarrier();
  for (auto [record, fanOut] : llvm::enumerate(fanOuts)) {
    OpBuilder::InsertionGuard fanOutGuard(b);
    runFanOut(fanOut.first, fanOut.second, record);
    fanOut.first->erase();
  }
  if (ranged.empty())
    return success();
  // Each storing thread's fence makes its relaxed slot stores releases of
  // everything the CTA did before the barrier (thread 0's acquires
  // included): a consumer that pops a slot sees the task's results. A
  // thread with no slot to store (tid >= every count: most instances push
  // nothing) skips the fence.
  auto word = [&](int64_t record, int64_t k) -> Value {
    return arith::IndexCastOp::create(
        b, b.getIndexType(),
        memref::LoadOp::create(b, pushRecords,
                               ValueRange{index(3 * record + k)}));
  };
  SmallVector<std::array<Value, 3>> records; // first slot, instance, count
  Value most = index(0);
  for (int64_t record = 0; record < (int64_t)ranged.size(); ++record) {
    records.push_back({word(record, 0), word(record, 1), word(record, 2)});
    most = arith::MaxUIOp::create(b, most, records.back()[2]);
  }
  Value tid = gpu::ThreadIdOp::create(b, gpu::Dimension::x);
  auto ifStores = scf::IfOp::create(
      b, TypeRange(),
      arith::CmpIOp::create(b, arith::CmpIPredicate::ult, tid, most), false);
  OpBuilder::InsertionGuard storesGuard(b);
  b.setInsertionPointToStart(ifStores.thenBlock());
  asmVoid("fence.acq_rel.gpu;", "", ValueRange());
  Value threads = gpu::BlockDimOp::create(b, gpu::Dimension::x);
  Value capacity = arith::SubIOp::create(b, queueCapacity, readyAtStart);
  // This thread's share of each record: k = tid, tid + blockDim, ...
  for (auto [record, task] : llvm::enumerate(ranged)) {
    auto [first, instance, count] = records[record];
    auto loop = scf::ForOp::create(b, tid, count, threads);
    OpBuilder::InsertionGuard loopGuard(b);
    b.setInsertionPointToStart(loop.getBody());
    Value k = loop.getInductionVar();
    storePushSlot(arith::AddIOp::create(b, first, k),
                  arith::AddIOp::create(b, instance, k), task, capacity);
  }
  return success();
}

/// A fan-out loop (DynamicSchedule's per-instance ready counters: a
/// completed one-coordinate in-edge notifies every instance's counter and
/// pushes the instances it completes) costs thread 0 two dependent atomics
/// per instance (~280 µs for 256 instances of the MoE slot graph's down
/// task). Such a loop (notifies and pushes its only etensor ops), under
/// scf.if only and with at most kMaxFanOutLiveIns integer values from
/// thread 0's section, leaves it: at its place thread 0 stores "runs" and
/// those values into a record of workgroup words (each record says "does
/// not run" at the section's start), and after the section's barrier every
/// thread runs iterations tid, tid + blockDim, ... (runFanOut). Returns the
/// loops taken, detached from the section, each with its live-in values.
SmallVector<std::pair<scf::ForOp, SmallVector<Value>>>
KernelBuilder::takeFanOuts(scf::IfOp ifZero,
                           llvm::function_ref<bool(Operation *)> underIfsOnly) {
  SmallVector<std::pair<scf::ForOp, SmallVector<Value>>> taken;
  if (!pushRecords)
    return taken;
  auto inSection = [&](Value v) {
    Operation *def = v.getDefiningOp();
    Region *region = def ? def->getParentRegion() : v.getParentRegion();
    return ifZero->isProperAncestor(region->getParentOp()) ||
           region->getParentOp() == ifZero.getOperation();
  };
  SmallVector<scf::ForOp> loops;
  ifZero.walk<WalkOrder::PreOrder>([&](scf::ForOp loop) {
    bool notifies = false, pushes = false, retires = false;
    loop.walk([&](Operation *op) {
      notifies |= isa<NotifyOp>(op);
      pushes |= isa<PushOp>(op);
      retires |= isa<RetireOp>(op); // runFanOut lowers notifies and pushes
    });
    if (!notifies || !pushes || retires || loop.getNumResults() != 0)
      return WalkResult::advance();
    loops.push_back(loop);
    return WalkResult::skip();
  });
  for (scf::ForOp loop : loops) {
    if ((int64_t)taken.size() == kMaxFanOuts)
      break;
    llvm::SetVector<Value> used;
    getUsedValuesDefinedAbove(loop.getRegion(), used);
    for (Value bound :
         {loop.getLowerBound(), loop.getUpperBound(), loop.getStep()})
      used.insert(bound);
    SmallVector<Value> liveIns;
    bool fits = underIfsOnly(loop);
    for (Value v : used) {
      if (!inSection(v))
        continue;
      fits &= v.getType().isIntOrIndex();
      liveIns.push_back(v);
    }
    if (!fits || (int64_t)liveIns.size() > kMaxFanOutLiveIns)
      continue;
    int64_t base = 3 * kMaxRangePushes + kFanOutWords * taken.size();
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(ifZero.thenBlock());
    memref::StoreOp::create(b, i64(0), pushRecords, ValueRange{index(base)});
    b.setInsertionPoint(loop);
    memref::StoreOp::create(b, i64(1), pushRecords, ValueRange{index(base)});
    for (auto [k, v] : llvm::enumerate(liveIns)) {
      Value word = v.getType().isIndex() ? toI64(v)
                   : v.getType().getIntOrFloatBitWidth() < 64
                       ? arith::ExtUIOp::create(b, b.getI64Type(), v)
                       : v;
      memref::StoreOp::create(b, word, pushRecords,
                              ValueRange{index(base + 1 + (int64_t)k)});
    }
    // Thread 0 no longer runs the loop; runFanOut clones it after the
    // barrier, and the caller erases it then.
    loop->remove();
    taken.push_back({loop, liveIns});
  }
  return taken;
}

/// Every thread: when record `record` says its loop runs, iterations tid,
/// tid + blockDim, ... of `loop` over the live-in values stored there, the
/// notifies and pushes lowered to this thread's atomics.
void KernelBuilder::runFanOut(scf::ForOp loop, ArrayRef<Value> liveIns,
                              int64_t record) {
  int64_t base = 3 * kMaxRangePushes + kFanOutWords * record;
  Value runs = arith::CmpIOp::create(
      b, arith::CmpIPredicate::ne,
      memref::LoadOp::create(b, pushRecords, ValueRange{index(base)}), i64(0));
  auto ifRuns = scf::IfOp::create(b, TypeRange(), runs, false);
  b.setInsertionPointToStart(ifRuns.thenBlock());
  IRMapping map;
  for (auto [k, v] : llvm::enumerate(liveIns)) {
    Value word = memref::LoadOp::create(
        b, pushRecords, ValueRange{index(base + 1 + (int64_t)k)});
    Type type = v.getType();
    map.map(v, type.isIndex()
                   ? arith::IndexCastOp::create(b, type, word).getResult()
               : type.getIntOrFloatBitWidth() < 64
                   ? arith::TruncIOp::create(b, type, word).getResult()
                   : word);
  }
  Value tid = gpu::ThreadIdOp::create(b, gpu::Dimension::x);
  Value threads = gpu::BlockDimOp::create(b, gpu::Dimension::x);
  Value lower = map.lookupOrDefault(loop.getLowerBound());
  Value step = map.lookupOrDefault(loop.getStep());
  auto mine = scf::ForOp::create(
      b, arith::AddIOp::create(b, lower, arith::MulIOp::create(b, tid, step)),
      map.lookupOrDefault(loop.getUpperBound()),
      arith::MulIOp::create(b, step, threads));
  map.map(loop.getInductionVar(), mine.getInductionVar());
  b.setInsertionPointToStart(mine.getBody());
  for (Operation &op : loop.getBody()->without_terminator())
    b.clone(op, map);
  SmallVector<Operation *> etensorOps;
  mine.walk([&](Operation *op) {
    if (isa<NotifyOp, PushOp, CheckRangeOp>(op))
      etensorOps.push_back(op);
  });
  for (Operation *op : etensorOps) {
    b.setInsertionPoint(op);
    if (auto notify = dyn_cast<NotifyOp>(op))
      lowerThreadNotify(notify);
    else if (auto check = dyn_cast<CheckRangeOp>(op))
      lowerThreadCheckRange(check);
    else
      lowerThreadPush(cast<PushOp>(op));
    op->erase();
  }
}

/// Thread 0: one atomic on the push counter claims `count` ring slots;
/// returns the first (i64).
Value KernelBuilder::claimRingSlots(Value count) {
  return asm64("atom.relaxed.gpu.global.add.u64 $0, [$1], $2;", "=l,l,l",
               ValueRange{queueAddress(index(kTail)), toI64(count)});
}

/// Thread 0: claim the slots of a range push and leave (first slot, first
/// instance, count) in record `record` of `pushRecords`.
void KernelBuilder::reserveRangePush(PushOp push, int64_t record) {
  Value words[] = {claimRingSlots(push.getCount()), toI64(push.getInstance()),
                   toI64(push.getCount())};
  for (auto [k, word] : llvm::enumerate(words))
    memref::StoreOp::create(b, word, pushRecords,
                            ValueRange{index(3 * record + k)});
}

/// By thread 0 alone. With a result: an acq_rel add, so the notifier that
/// completes the coordinate also acquires every earlier producer's release
/// and its pushes carry them on to the consumer.
void KernelBuilder::lowerThreadNotify(NotifyOp notify) {
  EventInfo &info = events[notify.getEvent()];
  SmallVector<Value> coords(notify.getIndices());
  auto [addr, scope] = notifyAddress(info, coords);
  if (!notify.getCompleted()) {
    asmVoid(("red.release." + scope + ".global.add.u32 [$0], 1;").str(), "l",
            addr);
    return;
  }
  Value old =
      asm32("atom.acq_rel.gpu.global.add.u32 $0, [$1], 1;", "=r,l", addr);
  Value now = arith::AddIOp::create(b, old, i32(1));
  Value completed = arith::CmpIOp::create(b, arith::CmpIPredicate::eq, now,
                                          waitCount(info, coords));
  notify.getCompleted().replaceAllUsesWith(completed);
}

/// By thread 0 alone: claim `count` ring slots, then publish each
/// descriptor. One `fence.acq_rel` before relaxed stores makes each store a
/// release (PTX's release pattern) without a fence per slot: a range of N
/// release stores costs N fences, which serialised a 128-instance push into
/// tens of microseconds. Slots past the capacity are reported, never written.
void KernelBuilder::lowerThreadPush(PushOp push) {
  Value count = push.getCount() ? push.getCount() : index(1);
  asmVoid("fence.acq_rel.gpu;", "", ValueRange());
  Value first =
      arith::IndexCastOp::create(b, b.getIndexType(), claimRingSlots(count));
  Value capacity = arith::SubIOp::create(b, queueCapacity, readyAtStart);
  int64_t task = push.getTaskAttr().getInt();
  auto loop = scf::ForOp::create(b, index(0), count, index(1));
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPointToStart(loop.getBody());
  Value k = loop.getInductionVar();
  storePushSlot(arith::AddIOp::create(b, first, k),
                arith::AddIOp::create(b, push.getInstance(), k), task,
                capacity);
}

/// The descriptor of `instance` of `task` into ring slot `slot`, or, past
/// the ring's `capacity`, the first overflow's report in the status words.
void KernelBuilder::storePushSlot(Value slot, Value instance, int64_t task,
                                  Value capacity) {
  OpBuilder::InsertionGuard guard(b);
  Value overflow =
      arith::CmpIOp::create(b, arith::CmpIPredicate::uge, slot, capacity);
  auto ifOverflow = scf::IfOp::create(b, TypeRange(), overflow, true);
  b.setInsertionPointToStart(ifOverflow.thenBlock());
  recordFailure(kQueueOverflow, {{kTaskId, i32(task)},
                                 {kInstance, instance},
                                 {kCounter, slot},
                                 {kWaitCount, capacity}});
  b.setInsertionPointToStart(ifOverflow.elseBlock());
  Value descriptor = arith::OrIOp::create(b, i64((task + 1) << kInstanceBits),
                                          toI64(instance));
  asmVoid("st.relaxed.gpu.global.u64 [$0], $1;", "l,l",
          ValueRange{queueAddress(arith::AddIOp::create(b, slot, index(kRing))),
                     descriptor});
}

/// By thread 0 alone: check a trigger range before its push.
void KernelBuilder::lowerThreadCheckRange(CheckRangeOp check) {
  check.getOk().replaceAllUsesWith(
      checkTriggerRange(check.getTask(), check.getCoordinate(),
                        check.getBegin(), check.getEnd(), check.getBound()));
}

/// By thread 0 alone: lower the termination count; workers polling a
/// position past the new count see it and exit.
void KernelBuilder::lowerThreadRetire(RetireOp retire) {
  asmVoid("red.relaxed.gpu.global.add.u64 [$0], $1;", "l,l",
          ValueRange{queueAddress(index(kRetired)), toI64(retire.getCount())});
}

namespace {
struct ConvertETensorToGPUPass
    : public etensor::impl::ConvertETensorToGPUBase<ConvertETensorToGPUPass> {
  using Base::Base;

  /// `outline`: the kernel's calls of the named device functions (all with
  /// `*`) stay calls. An unknown name is an error, not a silent no-op.
  LogicalResult markOutlinedCalls(GraphOp graph, gpu::GPUFuncOp kernel) {
    if (outline.empty())
      return success();
    bool all = llvm::is_contained(outline, "*");
    llvm::StringSet<> called;
    kernel.walk([&](func::CallOp call) {
      called.insert(call.getCallee());
      if (all || llvm::is_contained(outline, call.getCallee()))
        call.setNoInline(true);
    });
    for (const std::string &name : outline)
      if (name != "*" && !called.contains(name))
        return graph.emitOpError("outline names '")
               << name << "', which the kernel never calls";
    return success();
  }

  void runOnOperation() override {
    ModuleOp module = getOperation();
    SmallVector<GraphOp> graphs(module.getOps<GraphOp>());
    if (graphs.empty())
      return;
    module->setAttr(gpu::GPUDialect::getContainerModuleAttrName(),
                    UnitAttr::get(&getContext()));
    SymbolTable symbols(module);
    llvm::SetVector<Operation *> deviceFunctions;
    for (GraphOp graph : graphs) {
      if (failed(convertGraph(graph, symbols, deviceFunctions)))
        return signalPassFailure();
    }
    // The launch needs each kernel's dynamic shared memory; the kernel
    // modules become binaries later, so the host module keeps it too:
    // `etensor.dynamic_shared_memory = {kernel = bytes}`.
    SmallVector<NamedAttribute> dynamicShared;
    module.walk([&](gpu::GPUFuncOp kernel) {
      if (auto bytes = kernel->getAttrOfType<IntegerAttr>(
              "etensor.dynamic_shared_memory"))
        dynamicShared.push_back(NamedAttribute(kernel.getNameAttr(), bytes));
    });
    if (!dynamicShared.empty())
      module->setAttr("etensor.dynamic_shared_memory",
                      DictionaryAttr::get(&getContext(), dynamicShared));
    for (GraphOp graph : graphs)
      graph.erase();
    // Device functions and their globals now live in the kernel modules; the
    // host keeps none. Functions go first: they are the globals' users.
    SmallVector<Operation *> globals;
    for (Operation *op : deviceFunctions) {
      if (isa<memref::GlobalOp>(op))
        globals.push_back(op);
      else if (SymbolTable::symbolKnownUseEmpty(op, module))
        op->erase();
    }
    for (Operation *global : globals)
      if (SymbolTable::symbolKnownUseEmpty(global, module))
        global->erase();
    // A workgroup global that no device function reads (a tile's declared
    // but unused buffer) would stay on the host, where the memref lowering
    // cannot place its address space: it declares nothing, so it goes.
    for (auto global :
         llvm::make_early_inc_range(module.getOps<memref::GlobalOp>()))
      if (isWorkgroupMemorySpace(global.getType().getMemorySpace()) &&
          SymbolTable::symbolKnownUseEmpty(global, module))
        global.erase();
  }

  LogicalResult convertGraph(GraphOp graph, SymbolTable &symbols,
                             llvm::SetVector<Operation *> &deviceFunctions) {
    MLIRContext *ctx = &getContext();
    // The kernel is a public PTX entry named after the graph; the NVPTX
    // printer aborts on a name that it would have to quote.
    if (!isPTXIdentifier(graph.getSymName()))
      return graph.emitOpError("name '")
             << graph.getSymName()
             << "' is not a PTX identifier ([a-zA-Z_$][a-zA-Z0-9_$]*), so it "
                "cannot name the kernel";
    OpBuilder builder(graph);
    auto gpuModule = gpu::GPUModuleOp::create(
        builder, graph.getLoc(), (graph.getSymName() + "_kernels").str());
    builder.setInsertionPointToStart(gpuModule.getBody());

    // Clone every function the graph calls, transitively, and every
    // memref.global they read: a global in workgroup memory is how a tile
    // gets shared memory (a workgroup alloca cannot lower on NVPTX).
    SmallVector<Operation *> worklist{graph};
    llvm::SetVector<Operation *> callees;
    bool invalid = false;
    while (!worklist.empty()) {
      Operation *op = worklist.pop_back_val();
      op->walk([&](Operation *nested) {
        if (auto alloca = dyn_cast<memref::AllocaOp>(nested)) {
          if (!isStackMemorySpace(alloca.getType().getMemorySpace())) {
            alloca.emitOpError(
                "outside the default or private memory space cannot lower on "
                "NVPTX; for workgroup (shared) memory declare a memref.global "
                "in that space and read it with memref.get_global");
            invalid = true;
          }
          return;
        }
        Operation *used = nullptr;
        if (auto call = dyn_cast<func::CallOp>(nested))
          used = symbols.lookup(call.getCallee());
        else if (auto global = dyn_cast<memref::GetGlobalOp>(nested))
          used = symbols.lookup(global.getNameAttr().getAttr());
        if (used && callees.insert(used))
          worklist.push_back(used);
      });
    }
    if (invalid)
      return failure();
    for (Operation *callee : callees) {
      // Only the worker's etensor ops are lowered; inside a device function
      // they would reach LLVM translation as unrealized casts.
      WalkResult nested = callee->walk([&](Operation *op) {
        if (op->getDialect() && isa<ETensorDialect>(op->getDialect())) {
          op->emitOpError("cannot appear in a device function; events and "
                          "queues belong to the graph");
          return WalkResult::interrupt();
        }
        // LLVM asserts on a larger alignment when translating the module.
        auto align = op->getAttrOfType<IntegerAttr>("alignment");
        if (align && align.getValue().ugt(kMaxLLVMAlignment)) {
          op->emitOpError("alignment ")
              << llvm::toString(align.getValue(), 10, /*Signed=*/false)
              << " exceeds LLVM's maximum of " << kMaxLLVMAlignment;
          return WalkResult::interrupt();
        }
        return WalkResult::advance();
      });
      if (nested.wasInterrupted())
        return failure();
      Operation *copy = builder.clone(*callee);
      if (auto fn = dyn_cast<func::FuncOp>(copy)) {
        if (fn.isExternal())
          return fn.emitOpError("device function has no body");
        fn.setPrivate();
      }
      deviceFunctions.insert(callee);
    }

    SmallVector<Type> argTypes(graph.getArgumentTypes());
    int64_t numGraphArgs = argTypes.size();
    Type i32Buffer =
        MemRefType::get({ShapedType::kDynamic}, IntegerType::get(ctx, 32));
    Type i64Buffer =
        MemRefType::get({ShapedType::kDynamic}, IntegerType::get(ctx, 64));
    argTypes.append({i32Buffer, i64Buffer, i32Buffer, IndexType::get(ctx)});
    // Ranked events: the address of every rank's counters.
    bool ranked = llvm::any_of(graph.getBodyBlock().getOps<EventOp>(),
                               [](EventOp e) { return e.getRanked(); });
    if (ranked)
      argTypes.push_back(i64Buffer);
    if (trace)
      argTypes.push_back(i64Buffer);
    // The kernel's own workgroup words: the broadcast word (the dynamic
    // worker's popped task descriptors, the static one's drawn tickets and
    // pool instances) and the dynamic worker's range-push and fan-out
    // records (see emitThreadZero). Where they go was measured
    // (bench/RESULTS.md item 134): the static worker's word is a `.shared`
    // variable of its own (in the tiles' buffer, a ticketed MoE layer took
    // up to 18 % longer), and the tiles' buffer then starts on a 128-byte
    // line (overlayWorkgroupGlobals); the dynamic worker's 312 bytes are
    // globals placed after the tiles' buffer (in front, they pushed the
    // decoder's large-batch tiles to a 1 KiB line and its two CTAs past
    // 196 KiB of shared memory: 5.5 % slower).
    bool staticWorker = false, drawing = false;
    graph.walk([&](Operation *op) {
      if (auto worker = dyn_cast<WorkerOp>(op))
        staticWorker |= worker.getSchedule() == ScheduleKind::Static;
      else if (auto dispatch = dyn_cast<DispatchOp>(op))
        drawing |= dispatch.getTicket() || dispatch.getPool();
    });
    bool pushes = graph->walk([](PushOp) { return WalkResult::interrupt(); })
                      .wasInterrupted();
    auto wordsType = [&](int64_t words) {
      return MemRefType::get(
          {words}, IntegerType::get(ctx, 64), AffineMap(),
          gpu::AddressSpaceAttr::get(ctx, gpu::AddressSpace::Workgroup));
    };
    auto declareKernelWords = [&](StringRef name, int64_t words) {
      OpBuilder::InsertionGuard guard(builder);
      builder.setInsertionPointToStart(gpuModule.getBody());
      auto global = memref::GlobalOp::create(
          builder, graph.getLoc(), name, builder.getStringAttr("private"),
          wordsType(words), Attribute(), /*constant=*/false,
          builder.getI64IntegerAttr(16));
      global->setAttr(kKernelWordsAttrName, builder.getUnitAttr());
    };
    SmallVector<Type> workgroup;
    // Word 1: the static worker's queue slice (sm-slices, staticSlice).
    if (staticWorker && (drawing || smSlices))
      workgroup.push_back(wordsType(smSlices ? 2 : 1));
    if (!staticWorker)
      declareKernelWords(kBroadcastGlobal, 1);
    if (pushes)
      declareKernelWords(kPushRecordsGlobal,
                         3 * kMaxRangePushes + kMaxFanOuts * kFanOutWords);
    auto kernel = gpu::GPUFuncOp::create(
        builder, graph.getLoc(), graph.getSymName(),
        builder.getFunctionType(argTypes, {}), workgroup);
    kernel->setAttr(gpu::GPUDialect::getKernelFuncAttrName(),
                    builder.getUnitAttr());
    int64_t threads = blockSize;
    if (auto attr = graph->getAttrOfType<IntegerAttr>("etensor.block_size"))
      threads = attr.getInt();
    if (threads < 1 || threads > 1024)
      return graph.emitOpError("block size must be in 1..1024 threads (a "
                               "CUDA block's most), got ")
             << threads;
    if (watchdogPolls < 1)
      return graph.emitOpError("watchdog-polls must be >= 1, got ")
             << static_cast<int64_t>(watchdogPolls);
    kernel.setKnownBlockSizeAttr(
        builder.getDenseI32ArrayAttr({(int32_t)threads, 1, 1}));
    kernel->setAttr("etensor.watchdog_polls",
                    builder.getI64IntegerAttr(watchdogPolls));
    if (minCtasPerSM < 0)
      return graph.emitOpError("min-ctas-per-sm must be >= 0, got ")
             << static_cast<int64_t>(minCtasPerSM);
    if (minCtasPerSM > 0)
      kernel->setAttr("nvvm.minctasm", builder.getI32IntegerAttr(minCtasPerSM));

    if (maxPopChunk < 1)
      return graph.emitOpError("max-pop-chunk must be >= 1, got ")
             << static_cast<int64_t>(maxPopChunk);
    // Static schedule: the functions each shared region's tasks call.
    llvm::StringMap<int64_t> regionOf;
    SmallVector<DispatchOp> staticDispatches;
    graph.walk([&](WorkerOp worker) {
      if (worker.getSchedule() == ScheduleKind::Static)
        llvm::append_range(staticDispatches,
                           worker.getBody().getOps<DispatchOp>());
    });
    if (llvm::any_of(staticDispatches,
                     [](DispatchOp d) { return d.getSharedRegionAttr(); }))
      for (DispatchOp dispatch : staticDispatches)
        for (auto call : dispatch.getBody().getOps<func::CallOp>()) {
          auto [at, fresh] =
              regionOf.try_emplace(call.getCallee(), sharedRegion(dispatch));
          if (!fresh && at->second != sharedRegion(dispatch))
            return graph.emitOpError("function '")
                   << call.getCallee() << "' is called by tasks in shared "
                   << "regions " << at->second << " and "
                   << sharedRegion(dispatch)
                   << ": a tile's shared memory belongs to one region";
        }
    KernelBuilder kernelBuilder(graph, kernel, numGraphArgs, ranked, trace);
    kernelBuilder.blockThreads = threads;
    kernelBuilder.maxPopChunk = maxPopChunk;
    kernelBuilder.prefetchNext = prefetchNext;
    kernelBuilder.smSlices = smSlices;
    kernelBuilder.recordSM = recordSM;
    kernelBuilder.queueAhead = queueAhead;
    kernelBuilder.waitMemo = waitMemo;
    kernelBuilder.convergentReductions = convergentReductions;
    kernelBuilder.checkCounts = checkTableCounts;
    kernelBuilder.popAhead = popAhead;
    if (failed(kernelBuilder.build()))
      return failure();
    if (failed(markOutlinedCalls(graph, kernel)))
      return failure();
    return overlayWorkgroupGlobals(gpuModule, kernel, regionOf);
  }
};
} // namespace
