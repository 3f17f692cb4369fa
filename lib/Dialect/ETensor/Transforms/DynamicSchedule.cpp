//===- DynamicSchedule.cpp - Tasks to an on-GPU ready queue ---------------===//
//
// Part of ETC, the Event Tensor Compiler.
//
//===----------------------------------------------------------------------===//

#include "etc/Dialect/ETensor/Transforms/GraphAnalysis.h"
#include "etc/Dialect/ETensor/Transforms/Passes.h"
#include "mlir/Dialect/Affine/Utils.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/IR/Builders.h"

namespace mlir::etensor {
#define GEN_PASS_DEF_ETENSORDYNAMICSCHEDULE
#include "etc/Dialect/ETensor/Transforms/Passes.h.inc"
} // namespace mlir::etensor

using namespace mlir;
using namespace mlir::etensor;

namespace {

/// Builds the dynamic worker of one graph.
class DynamicScheduler {
public:
  DynamicScheduler(GraphOp graphOp, bool earlyPush)
      : graph(graphOp), earlyPush(earlyPush), b(graphOp.getContext()) {}

  LogicalResult run();

private:
  /// Which consumers of an event a completed coordinate pushes.
  enum class Consumers { All, Regular, Triggered };
  Value index(Location loc, int64_t v) {
    return arith::ConstantIndexOp::create(b, loc, v);
  }
  Value extent(Location loc, OpFoldResult ofr) {
    if (auto attr = dyn_cast<Attribute>(ofr))
      return index(loc, cast<IntegerAttr>(attr).getInt());
    return cast<Value>(ofr);
  }
  SmallVector<Value> applyMap(Location loc, AffineMap map, ValueRange coords,
                              TaskOp task);
  /// A ranked event is notified from other ranks too: its consumers are
  /// never pushed, they wait for it after the pop.
  static bool isRanked(Value event) {
    return cast<EventOp>(event.getDefiningOp()).getRanked();
  }
  /// In-edges that decide when an instance is pushed (not ranked ones).
  static int64_t pushingInEdges(TaskOp task) {
    return llvm::count_if(task.getInEvents(),
                          [](Value e) { return !isRanked(e); });
  }
  /// Every pushing in-edge maps all instances to one constant coordinate
  /// (`"i->0"`): they all become ready together, so one counter serves the
  /// whole task and its completion pushes the grid as one range.
  static bool allConstantInEdges(TaskOp task) {
    for (auto [event, mapAttr] :
         llvm::zip(task.getInEvents(), task.getInMaps()))
      if (!isRanked(event) && !isConstantMap(mapAttr))
        return false;
    return true;
  }
  /// Every result of the edge map is a constant: all instances wait on one
  /// coordinate.
  static bool isConstantMap(Attribute mapAttr) {
    return llvm::all_of(
        cast<AffineMapAttr>(mapAttr).getValue().getResults(),
        [](AffineExpr e) { return isa<AffineConstantExpr>(e); });
  }
  /// A one-coordinate in-edge next to per-instance ones: the task gets a
  /// ready counter per instance, and that coordinate's completion updates
  /// them all, one dependent atomic after another on one thread (the MoE
  /// top-k waiting on `cleared` started 430 us late at T=4096). Said as a
  /// warning: the graph is correct, only slow.
  static void warnWholeGridFanOut(TaskOp task) {
    for (auto [event, mapAttr] :
         llvm::zip(task.getInEvents(), task.getInMaps())) {
      if (isRanked(event) || !isConstantMap(mapAttr))
        continue;
      auto op = cast<EventOp>(event.getDefiningOp());
      task.emitWarning("task '")
          << task.getDisplayName() << "' waits on one coordinate of event '"
          << op.getDisplayName()
          << "' from every instance, next to per-instance in-edges: the "
             "dynamic schedule gives each instance a ready counter, and that "
             "coordinate's completion updates them one after another (one "
             "dependent atomic per instance); move the edge to a task whose "
             "in-edges all map to constant coordinates";
      return;
    }
  }
  Value linearize(Location loc, ArrayRef<Value> coords, TaskOp task);
  void pushConsumers(Location loc, EventOp event, ValueRange coordinate,
                     Consumers which);
  void pushTriggered(Location loc, unsigned taskIndex, Value coordinate);
  void notifyThenPush(Location loc, Value counter, EventOp event,
                      ValueRange coordinate, Consumers which);
  LogicalResult checkTriggeredInEdges(unsigned taskIndex);
  bool hasTriggeredConsumers(EventOp event) {
    return llvm::any_of(graph.getConsumers(event), [](EdgeRef e) {
      return e.edge == EdgeRef::kTriggerEdge;
    });
  }
  Value declareLike(Location loc, EventOp event, StringRef name);

  TaskGraph graph;
  bool earlyPush;
  OpBuilder b;
  DenseMap<unsigned, int64_t> number;      // graph task index -> task number
  DenseMap<unsigned, Value> readyEvent;    // task index -> ready.<task>
  llvm::DenseSet<unsigned> wholeTaskReady; // ready.<task> of one coordinate
  DenseMap<Operation *, Value> dispatched; // event -> dispatched.<event>
  DenseMap<unsigned, Value> firedEvent;    // triggered task -> fired.<task>
  Value queue;
};

} // namespace

SmallVector<Value> DynamicScheduler::applyMap(Location loc, AffineMap map,
                                              ValueRange coords, TaskOp task) {
  SmallVector<Value> symbols;
  if (map.getNumSymbols())
    symbols.push_back(task.getRank());
  SmallVector<Value> results;
  for (AffineExpr expr : map.getResults()) {
    if (auto dim = dyn_cast<AffineDimExpr>(expr))
      results.push_back(coords[dim.getPosition()]);
    else if (auto symbol = dyn_cast<AffineSymbolExpr>(expr))
      results.push_back(symbols[symbol.getPosition()]);
    else
      results.push_back(
          affine::expandAffineExpr(b, loc, expr, coords, symbols));
  }
  return results;
}

Value DynamicScheduler::linearize(Location loc, ArrayRef<Value> coords,
                                  TaskOp task) {
  Value linear = index(loc, 0);
  for (auto [d, coord] : llvm::enumerate(coords))
    linear = arith::AddIOp::create(
        b, loc,
        arith::MulIOp::create(b, loc, linear,
                              extent(loc, task.getMixedExtent(d))),
        coord);
  return linear;
}

/// Every consumer instance whose in-edge maps to `coordinate` has one more
/// completed dependency: push it, or count it on its ready event when it
/// has several.
void DynamicScheduler::pushConsumers(Location loc, EventOp event,
                                     ValueRange coordinate, Consumers which) {
  for (EdgeRef edge : graph.getConsumers(event)) {
    TaskOp consumer = graph.getTasks()[edge.task];
    if (edge.edge == EdgeRef::kTriggerEdge) {
      if (which != Consumers::Regular)
        pushTriggered(loc, edge.task, coordinate[0]);
      continue;
    }
    // A triggered task is pushed by its trigger only and waits for its
    // other in-edges after the pop.
    if (which == Consumers::Triggered || consumer.getTriggerEvent() ||
        isRanked(event.getEvent()))
      continue;
    AffineMap map =
        cast<AffineMapAttr>(consumer.getInMaps()[edge.edge]).getValue();
    OpBuilder::InsertionGuard guard(b);
    SmallVector<Value> instance(consumer.getGridRank());
    Value matches;
    for (auto [k, expr] : llvm::enumerate(map.getResults())) {
      if (auto dim = dyn_cast<AffineDimExpr>(expr)) {
        instance[dim.getPosition()] = coordinate[k];
        // The event may be longer than the consumer's grid (`layer_in[l]`
        // feeds `norm(l)` for l < layers and its last coordinate another
        // task): only coordinates inside the grid have consumers here.
        OpFoldResult gridExtent = consumer.getMixedExtent(dim.getPosition());
        if (gridExtent == event.getMixedSize(k))
          continue;
        Value inside =
            arith::CmpIOp::create(b, loc, arith::CmpIPredicate::ult,
                                  coordinate[k], extent(loc, gridExtent));
        matches =
            matches ? arith::AndIOp::create(b, loc, matches, inside) : inside;
        continue;
      }
      // A constant result: only that coordinate has consumers.
      // A constant, or the rank: this instance's rank pushes it.
      Value expected =
          isa<AffineSymbolExpr>(expr)
              ? consumer.getRank()
              : index(loc, cast<AffineConstantExpr>(expr).getValue());
      Value eq = arith::CmpIOp::create(b, loc, arith::CmpIPredicate::eq,
                                       coordinate[k], expected);
      matches = matches ? arith::AndIOp::create(b, loc, matches, eq) : eq;
    }
    if (matches) {
      auto ifMatches = scf::IfOp::create(b, loc, matches, false);
      b.setInsertionPointToStart(ifMatches.thenBlock());
    }
    IntegerAttr task = b.getI64IntegerAttr(number[edge.task]);
    Value ready = readyEvent.lookup(edge.task);
    if (ready && wholeTaskReady.contains(edge.task)) {
      // One counter for the task: the in-edge that completes it pushes the
      // whole grid as a range, not one dependent atomic per instance.
      Value zero = index(loc, 0);
      Value done =
          NotifyOp::create(b, loc, b.getI1Type(), ready, ValueRange{zero})
              .getResult(0);
      auto ifDone = scf::IfOp::create(b, loc, done, false);
      b.setInsertionPointToStart(ifDone.thenBlock());
      Value count;
      for (int64_t d = 0; d < consumer.getGridRank(); ++d) {
        Value size = extent(loc, consumer.getMixedExtent(d));
        count = count ? arith::MulIOp::create(b, loc, count, size) : size;
      }
      PushOp::create(b, loc, queue, task, zero, count);
      continue;
    }
    // Dimensions the map drops: every value is a consumer. Without a ready
    // counter, the dropped innermost dimensions form one contiguous range of
    // linear instances: a single range push (one atomic on the tail, then
    // independent stores) instead of one dependent atomic per instance.
    int64_t rank = consumer.getGridRank();
    int64_t rangeFrom = rank;
    if (!ready)
      while (rangeFrom > 0 && !instance[rangeFrom - 1])
        --rangeFrom;
    Value count;
    for (int64_t d = rangeFrom; d < rank; ++d) {
      Value size = extent(loc, consumer.getMixedExtent(d));
      count = count ? arith::MulIOp::create(b, loc, count, size) : size;
      instance[d] = index(loc, 0);
    }
    for (int64_t d = 0; d < rangeFrom; ++d) {
      if (instance[d])
        continue;
      auto loop = scf::ForOp::create(b, loc, index(loc, 0),
                                     extent(loc, consumer.getMixedExtent(d)),
                                     index(loc, 1));
      b.setInsertionPointToStart(loop.getBody());
      instance[d] = loop.getInductionVar();
    }
    Value linear = linearize(loc, instance, consumer);
    if (ready) {
      Value done =
          NotifyOp::create(b, loc, b.getI1Type(), ready, instance).getResult(0);
      auto ifDone = scf::IfOp::create(b, loc, done, false);
      b.setInsertionPointToStart(ifDone.thenBlock());
    }
    PushOp::create(b, loc, queue, task, linear, count);
  }
}

/// Coordinate `c` of task `taskIndex`'s trigger completed: its instances
/// `[indptr[c], indptr[c+1])` are ready. The last coordinate to fire also
/// retires the bound's unused instances `[indptr[C], bound)`.
void DynamicScheduler::pushTriggered(Location loc, unsigned taskIndex,
                                     Value coordinate) {
  TaskOp task = graph.getTasks()[taskIndex];
  Value indptr = task.getTriggerIndptr();
  auto entry = [&](Value at) -> Value {
    Value raw = memref::LoadOp::create(b, loc, indptr, at);
    return arith::IndexCastOp::create(b, loc, b.getIndexType(), raw);
  };
  Value begin = entry(coordinate);
  Value end = entry(arith::AddIOp::create(b, loc, coordinate, index(loc, 1)));
  Value bound = extent(loc, task.getMixedExtent(0));
  // A range outside the grid is reported, never pushed.
  Value inGrid = CheckRangeOp::create(b, loc, b.getI1Type(), begin, end,
                                      number[taskIndex], coordinate, bound);
  Value count = arith::SelectOp::create(
      b, loc, inGrid, arith::SubIOp::create(b, loc, end, begin), index(loc, 0));
  PushOp::create(b, loc, queue, b.getI64IntegerAttr(number[taskIndex]), begin,
                 count);
  OpBuilder::InsertionGuard guard(b);
  Value last = NotifyOp::create(b, loc, b.getI1Type(), firedEvent[taskIndex],
                                ValueRange{index(loc, 0)})
                   .getResult(0);
  auto ifLast = scf::IfOp::create(b, loc, last, false);
  b.setInsertionPointToStart(ifLast.thenBlock());
  auto trigger = cast<EventOp>(task.getTriggerEvent().getDefiningOp());
  Value used = entry(extent(loc, trigger.getMixedSize(0)));
  // Past the bound the range check has already stopped the launch.
  Value unused = arith::MaxSIOp::create(
      b, loc, arith::SubIOp::create(b, loc, bound, used), index(loc, 0));
  RetireOp::create(b, loc, queue, unused);
}

/// Notifies `counter` at `coordinate`; the notification that completes it
/// pushes the consumers of that coordinate of `event`.
void DynamicScheduler::notifyThenPush(Location loc, Value counter,
                                      EventOp event, ValueRange coordinate,
                                      Consumers which) {
  Value done =
      NotifyOp::create(b, loc, b.getI1Type(), counter, coordinate).getResult(0);
  auto ifDone = scf::IfOp::create(b, loc, done, false);
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPointToStart(ifDone.thenBlock());
  pushConsumers(loc, event, coordinate, which);
}

/// A triggered task waits for its other in-edges after its pop. That cannot
/// deadlock when those events complete before the trigger fires: every
/// producer of them must precede every producer of the trigger event.
LogicalResult DynamicScheduler::checkTriggeredInEdges(unsigned taskIndex) {
  TaskOp task = graph.getTasks()[taskIndex];
  auto trigger = cast<EventOp>(task.getTriggerEvent().getDefiningOp());
  for (EdgeRef producer : graph.getProducers(trigger)) {
    // Ancestors of this producer of the trigger.
    llvm::SmallDenseSet<unsigned> ancestors;
    SmallVector<unsigned> work{producer.task};
    while (!work.empty()) {
      unsigned t = work.pop_back_val();
      for (unsigned p : graph.getPredecessors(t))
        if (ancestors.insert(p).second)
          work.push_back(p);
    }
    for (Value in : task.getInEvents()) {
      auto inEvent = cast<EventOp>(in.getDefiningOp());
      for (EdgeRef source : graph.getProducers(inEvent)) {
        if (ancestors.contains(source.task))
          continue;
        TaskOp sourceTask = graph.getTasks()[source.task];
        TaskOp triggerTask = graph.getTasks()[producer.task];
        return task.emitOpError("waits on event '")
               << inEvent.getDisplayName() << "' besides its trigger '"
               << trigger.getDisplayName() << "', but its producer '"
               << sourceTask.getDisplayName()
               << "' does not precede the trigger's producer '"
               << triggerTask.getDisplayName()
               << "': the dynamic schedule waits for such edges after the "
                  "pop and could deadlock";
      }
    }
  }
  return success();
}

/// A counter tensor with the shape and wait counts of `event`.
Value DynamicScheduler::declareLike(Location loc, EventOp event,
                                    StringRef name) {
  auto copy = cast<EventOp>(b.clone(*event));
  copy.setNameAttr(b.getStringAttr(name));
  return copy.getEvent();
}

LogicalResult DynamicScheduler::run() {
  GraphOp graphOp = graph.getGraph();
  SmallVector<unsigned> cycle;
  FailureOr<SmallVector<unsigned>> order = graph.topologicalOrder(cycle);
  if (failed(order))
    return graphOp.emitOpError("has a dependency cycle; run "
                               "etensor-verify-graph for details");
  SmallVector<TaskOp> tasks = graph.getTasks();
  for (auto [t, task] : llvm::enumerate(tasks)) {
    if (task.getTriggerEvent()) {
      auto trigger = cast<EventOp>(task.getTriggerEvent().getDefiningOp());
      if (graph.getProducers(trigger).empty())
        return task.emitOpError("is triggered by event '")
               << trigger.getDisplayName()
               << "', which nothing notifies: the dynamic schedule fires a "
                  "trigger on a notification (use the static schedule)";
      if (failed(checkTriggeredInEdges(t)))
        return failure();
      continue; // Its in-edges are waited on, never enumerated.
    }
    for (auto [i, mapAttr] : llvm::enumerate(task.getInMaps())) {
      if (isRanked(task.getInEvents()[i]))
        continue; // Waited on after the pop, never enumerated.
      AffineMap map = cast<AffineMapAttr>(mapAttr).getValue();
      llvm::SmallDenseSet<unsigned> dims;
      for (AffineExpr expr : map.getResults()) {
        auto dim = dyn_cast<AffineDimExpr>(expr);
        if (isa<AffineConstantExpr, AffineSymbolExpr>(expr) ||
            (dim && dims.insert(dim.getPosition()).second))
          continue;
        return task.emitOpError("in map #")
               << i << " " << mapAttr
               << " is not a projection (each result a distinct grid "
                  "dimension or a constant): the dynamic schedule cannot "
                  "enumerate the consumers of a coordinate";
      }
    }
  }
  for (auto [n, t] : llvm::enumerate(*order))
    number[t] = n;

  Location loc = graphOp.getLoc();
  b.setInsertionPointToEnd(&graphOp.getBodyBlock());
  // Implicit events, in the documented order.
  for (unsigned t : *order) {
    TaskOp task = tasks[t];
    int64_t inEdges = pushingInEdges(task);
    if (inEdges < 2 || task.getTriggerEvent())
      continue;
    bool whole = allConstantInEdges(task);
    SmallVector<int64_t> shape(task.getStaticGrid());
    if (whole) {
      shape.assign(1, 1);
      wholeTaskReady.insert(t);
    } else {
      warnWholeGridFanOut(task);
    }
    auto type = EventType::get(b.getContext(), shape);
    auto ready = EventOp::create(
        b, task.getLoc(), type,
        whole ? ValueRange() : ValueRange(task.getDynamicGrid()),
        b.getI64IntegerAttr(inEdges), /*wait_count=*/Value(),
        /*wait_count_table=*/Value(), /*ranked=*/false,
        b.getStringAttr(("ready." + task.getDisplayName()).str()));
    readyEvent[t] = ready.getEvent();
  }
  for (unsigned t : *order) {
    TaskOp task = tasks[t];
    if (!task.getTriggerEvent())
      continue;
    // Counts the trigger's coordinates that fired; the last one retires
    // the bound's unused instances.
    auto trigger = cast<EventOp>(task.getTriggerEvent().getDefiningOp());
    OpFoldResult coords = trigger.getMixedSize(0);
    auto type = EventType::get(b.getContext(), {1});
    IntegerAttr staticCount;
    Value dynamicCount;
    if (auto attr = dyn_cast<Attribute>(coords))
      staticCount = b.getI64IntegerAttr(cast<IntegerAttr>(attr).getInt());
    else
      dynamicCount = cast<Value>(coords);
    firedEvent[t] =
        EventOp::create(
            b, task.getLoc(), type, ValueRange(), staticCount, dynamicCount,
            /*wait_count_table=*/Value(), /*ranked=*/false,
            b.getStringAttr(("fired." + task.getDisplayName()).str()))
            .getEvent();
  }
  // A table wait count may not be computed yet when a producer is
  // dispatched: those events push on completion even with early push.
  if (earlyPush)
    for (EventOp event : graph.getEvents())
      if (!graph.getConsumers(event).empty() && !event.getWaitCountTable() &&
          !event.getRanked())
        dispatched[event] =
            declareLike(event.getLoc(), event,
                        ("dispatched." + event.getDisplayName()).str());

  // Capacity: every instance of every task, each pushed at most once.
  Value capacity = index(loc, 0);
  for (TaskOp task : tasks) {
    Value size = index(loc, 1);
    for (int64_t d = 0; d < task.getGridRank(); ++d)
      size = arith::MulIOp::create(b, loc, size,
                                   extent(loc, task.getMixedExtent(d)));
    capacity = arith::AddIOp::create(b, loc, capacity, size);
  }
  queue = QueueOp::create(b, loc, QueueType::get(b.getContext()), capacity)
              .getQueue();
  auto worker = WorkerOp::create(b, loc, ScheduleKind::Dynamic, queue);
  Block *workerBody = b.createBlock(&worker.getBody());

  for (unsigned t : *order) {
    TaskOp task = tasks[t];
    Location taskLoc = task.getLoc();
    b.setInsertionPointToEnd(workerBody);
    auto dispatch = DispatchOp::create(
        b, taskLoc, b.getI64IntegerAttr(number[t]), task.getDynamicGrid(),
        task.getStaticGridAttr(), task.getTriggerEvent(),
        task.getTriggerIndptr(), /*ticket=*/Value(), /*pool=*/Value(),
        /*pool_dim=*/IntegerAttr(), task.getSharedRegionAttr(),
        task.getGuardedIndptrAttr());
    dispatch->setAttr("name", b.getStringAttr(task.getDisplayName()));
    if (pushingInEdges(task) == 0 && !task.getTriggerEvent())
      dispatch->setAttr("etensor.ready_at_start", b.getUnitAttr());
    Block *body = b.createBlock(&dispatch.getBody());
    SmallVector<Value> coords;
    for (int64_t d = 0; d < task.getCoordinateCount(); ++d)
      coords.push_back(body->addArgument(b.getIndexType(), taskLoc));
    b.setInsertionPointToStart(body);
    // Casts of the buffers first: nothing may separate the waits and the call.
    SmallVector<Value> callArgs(coords);
    llvm::append_range(callArgs, castArgsToCallee(b, task));
    callPrefetch(b, task, callArgs);

    auto outEdges = llvm::zip(task.getOutEvents(), task.getOutMaps());
    // Early push: this instance is dispatched, so the consumers whose last
    // producer it is may be popped now; they wait for completion below.
    if (earlyPush)
      for (auto [event, map] : outEdges) {
        auto eventOp = cast<EventOp>(event.getDefiningOp());
        Value shadow = dispatched.lookup(eventOp);
        if (!shadow)
          continue;
        notifyThenPush(taskLoc, shadow, eventOp,
                       applyMap(taskLoc, cast<AffineMapAttr>(map).getValue(),
                                coords, task),
                       Consumers::Regular);
      }
    // Ranked in-edges never push: they are always waited on here. (An
    // in-edge without a wait was complete when the instance was popped.)
    // With prefetch_after the prefetch follows the first in-edges' waits:
    // an early-pushed instance is popped before its producers end.
    forEachInEdgeWithPrefetch(
        b, task, callArgs, [&](Value event, AffineMap map) {
          if (earlyPush || task.getTriggerEvent() || isRanked(event))
            WaitOp::create(b, taskLoc, event,
                           applyMap(taskLoc, map, coords, task));
        });

    func::CallOp::create(b, taskLoc, task.getCallee(), TypeRange(), callArgs);

    for (auto [event, map] : outEdges) {
      SmallVector<Value> c =
          applyMap(taskLoc, cast<AffineMapAttr>(map).getValue(), coords, task);
      auto eventOp = cast<EventOp>(event.getDefiningOp());
      // A trigger fires on completion even with early push: its indptr is
      // only final once the producers have run.
      bool early = dispatched.count(eventOp);
      Consumers which = early ? Consumers::Triggered : Consumers::All;
      if (graph.getConsumers(eventOp).empty() || eventOp.getRanked() ||
          (early && !hasTriggeredConsumers(eventOp))) {
        NotifyOp::create(b, taskLoc, /*completed=*/Type(), event, c);
        continue;
      }
      notifyThenPush(taskLoc, event, eventOp, c, which);
    }
    YieldOp::create(b, taskLoc);
  }
  for (TaskOp task : tasks)
    task.erase();
  return success();
}

namespace {
struct ETensorDynamicSchedulePass
    : public etensor::impl::ETensorDynamicScheduleBase<
          ETensorDynamicSchedulePass> {
  using Base::Base;
  void runOnOperation() override {
    getOperation().walk([&](GraphOp graph) {
      if (failed(DynamicScheduler(graph, earlyPush).run()))
        signalPassFailure();
    });
  }
};
} // namespace
