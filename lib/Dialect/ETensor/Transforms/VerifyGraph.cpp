//===- VerifyGraph.cpp - Whole-graph checks of etensor.graph --------------===//
//
// Part of ETC, the Event Tensor Compiler.
//
//===----------------------------------------------------------------------===//

#include "etc/Dialect/ETensor/Transforms/GraphAnalysis.h"
#include "etc/Dialect/ETensor/Transforms/Passes.h"
#include "mlir/IR/AffineExprVisitor.h"
#include "mlir/IR/AffineMap.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/SmallBitVector.h"
#include "llvm/Support/MathExtras.h"
#include "llvm/Support/raw_ostream.h"

namespace mlir::etensor {
#define GEN_PASS_DEF_ETENSORVERIFYGRAPH
#include "etc/Dialect/ETensor/Transforms/Passes.h.inc"
} // namespace mlir::etensor

using namespace mlir;
using namespace mlir::etensor;

namespace {

/// Number of notifications each coordinate of an event receives.
struct FanIn {
  /// Set when every coordinate receives the same number, `perCoordinate`.
  std::optional<AffineExpr> perCoordinate;
  /// Why the fan-in could not be computed symbolically, when it could not.
  std::string unknownReason;
};

/// Fan-in contributed by one producer edge whose map sends each grid point to
/// an event coordinate. Exact when every result is a distinct grid dimension
/// whose extent equals the event's extent, or a constant into an extent-1
/// dimension: then every coordinate receives the product of the extents of
/// the grid dimensions the map drops.
static std::optional<AffineExpr> uniformContribution(const TaskGraph &graph,
                                                     TaskOp task, AffineMap map,
                                                     EventOp event,
                                                     std::string &reason) {
  MLIRContext *ctx = task.getContext();
  llvm::SmallDenseSet<unsigned> usedDims;
  for (auto [k, result] : llvm::enumerate(map.getResults())) {
    std::optional<AffineExpr> eventExtent =
        graph.getSymbolicExpr(event.getMixedSize(k));
    if (auto dim = dyn_cast<AffineDimExpr>(result)) {
      if (!usedDims.insert(dim.getPosition()).second) {
        reason = "a grid dimension feeds two event dimensions";
        return std::nullopt;
      }
      std::optional<AffineExpr> gridExtent =
          graph.getSymbolicExpr(task.getMixedExtent(dim.getPosition()));
      if (!gridExtent || !eventExtent) {
        reason = "an extent is not an affine expression of the graph symbols";
        return std::nullopt;
      }
      if (simplifyAffineExpr(
              *gridExtent - *eventExtent, 0,
              task->getParentOfType<GraphOp>().getNumArguments()) !=
          getAffineConstantExpr(0, ctx)) {
        reason = "grid dimension " + std::to_string(dim.getPosition()) +
                 " and event dimension " + std::to_string(k) +
                 " have different extents, so some coordinates receive no "
                 "notification";
        return std::nullopt;
      }
      continue;
    }
    if (isa<AffineConstantExpr>(result) && eventExtent &&
        *eventExtent == getAffineConstantExpr(1, ctx))
      continue;
    reason = "map result " + std::to_string(k) +
             " is neither a grid dimension nor a constant into an extent-1 "
             "dimension";
    return std::nullopt;
  }
  AffineExpr product = getAffineConstantExpr(1, ctx);
  for (int64_t d = 0; d < task.getGridRank(); ++d) {
    if (usedDims.contains(d))
      continue;
    std::optional<AffineExpr> extent =
        graph.getSymbolicExpr(task.getMixedExtent(d));
    if (!extent) {
      reason = "an extent is not an affine expression of the graph symbols";
      return std::nullopt;
    }
    product = product * *extent;
  }
  return product;
}

static FanIn computeFanIn(const TaskGraph &graph, EventOp event) {
  FanIn fanIn;
  AffineExpr total = getAffineConstantExpr(0, event.getContext());
  for (EdgeRef producer : graph.getProducers(event)) {
    TaskOp task = graph.getTasks()[producer.task];
    AffineMap map =
        cast<AffineMapAttr>(task.getOutMaps()[producer.edge]).getValue();
    std::optional<AffineExpr> part =
        uniformContribution(graph, task, map, event, fanIn.unknownReason);
    if (!part) {
      fanIn.unknownReason =
          "task '" + task.getDisplayName().str() + "': " + fanIn.unknownReason;
      return fanIn;
    }
    total = total + *part;
  }
  fanIn.perCoordinate = simplifyAffineExpr(
      total, 0, event->getParentOfType<GraphOp>().getNumArguments());
  return fanIn;
}

/// Counts notifications per coordinate by enumeration, for fully static
/// graphs whose maps are not uniform. Returns false when it is too large.
static bool enumerateFanIn(const TaskGraph &graph, EventOp event,
                           SmallVectorImpl<int64_t> &counts,
                           SmallVectorImpl<int64_t> &shape) {
  constexpr int64_t kMaxPoints = 1 << 20;
  EventType type = event.getEventType();
  if (type.getNumDynamicDims())
    return false;
  shape.assign(type.getShape().begin(), type.getShape().end());
  // Products overflow with huge extents: give up rather than wrap around.
  int64_t size = 1;
  for (int64_t extent : shape)
    if (llvm::MulOverflow(size, extent, size) || size > kMaxPoints)
      return false;
  counts.assign(size, 0);
  for (EdgeRef producer : graph.getProducers(event)) {
    TaskOp task = graph.getTasks()[producer.task];
    if (llvm::any_of(task.getStaticGrid(), ShapedType::isDynamic))
      return false;
    int64_t points = 1;
    for (int64_t extent : task.getStaticGrid())
      if (llvm::MulOverflow(points, extent, points) || points > kMaxPoints)
        return false;
    AffineMap map =
        cast<AffineMapAttr>(task.getOutMaps()[producer.edge]).getValue();
    SmallVector<int64_t> point(task.getGridRank(), 0);
    for (int64_t p = 0; p < points; ++p) {
      int64_t rest = p;
      for (int64_t d = task.getGridRank() - 1; d >= 0; --d) {
        point[d] = rest % task.getStaticGrid()[d];
        rest /= task.getStaticGrid()[d];
      }
      SmallVector<int64_t> coord = map.compose(point);
      int64_t linear = 0;
      for (auto [k, c] : llvm::enumerate(coord)) {
        if (c < 0 || c >= shape[k]) {
          task.emitOpError("out map ")
              << AffineMapAttr::get(map) << " sends grid point " << p
              << " outside event '" << event.getDisplayName() << "'";
          return false;
        }
        linear = linear * shape[k] + c;
      }
      ++counts[linear];
    }
  }
  return true;
}

/// Evaluates `expr` with symbol k bound to `values[k]`; std::nullopt when it
/// does not fold (e.g. a division by a symbol).
static std::optional<int64_t> evaluate(AffineExpr expr,
                                       ArrayRef<int64_t> values) {
  MLIRContext *ctx = expr.getContext();
  SmallVector<AffineExpr> constants = llvm::map_to_vector(
      values, [&](int64_t v) { return getAffineConstantExpr(v, ctx); });
  AffineExpr folded = simplifyAffineExpr(expr.replaceSymbols(constants), 0, 0);
  if (auto constant = dyn_cast<AffineConstantExpr>(folded))
    return constant.getValue();
  return std::nullopt;
}

/// Looks for symbol values where the two counts differ, trying small values
/// first (off-by-one fan-ins show there), then pseudo-random ones. Returns a
/// description of the first disagreement found.
static std::optional<std::string>
findCounterexample(AffineExpr count, AffineExpr fanIn, unsigned numSymbols) {
  llvm::SmallBitVector used(numSymbols);
  for (AffineExpr root : {count, fanIn})
    root.walk([&](AffineExpr e) {
      if (auto symbol = dyn_cast<AffineSymbolExpr>(e))
        used.set(symbol.getPosition());
    });
  uint64_t state = 0x9E3779B97F4A7C15ull;
  for (int trial = 0; trial < 64; ++trial) {
    SmallVector<int64_t> values(numSymbols);
    for (unsigned k = 0; k < numSymbols; ++k) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      values[k] = trial < 8 ? trial + 1 : 1 + (state >> 33) % 1000;
    }
    std::optional<int64_t> lhs = evaluate(count, values);
    std::optional<int64_t> rhs = evaluate(fanIn, values);
    if (!lhs || !rhs || *lhs == *rhs)
      continue;
    std::string text;
    llvm::raw_string_ostream os(text);
    os << " (e.g. with";
    for (unsigned k : used.set_bits())
      os << " %arg" << k << " = " << values[k];
    os << ": " << *lhs << " vs " << *rhs << ")";
    return text;
  }
  return std::nullopt;
}

struct ETensorVerifyGraphPass
    : public etensor::impl::ETensorVerifyGraphBase<ETensorVerifyGraphPass> {
  void runOnOperation() override {
    getOperation().walk([&](GraphOp graph) {
      if (failed(verifyGraph(graph)))
        signalPassFailure();
    });
  }

  LogicalResult verifyGraph(GraphOp graphOp) {
    TaskGraph graph(graphOp);
    bool ok = true;

    SmallVector<unsigned> cycle;
    if (failed(graph.topologicalOrder(cycle))) {
      TaskOp first = graph.getTasks()[cycle.front()];
      InFlightDiagnostic diag = first.emitOpError()
                                << "task '" << first.getDisplayName()
                                << "' is part of a dependency cycle: ";
      for (unsigned t : cycle)
        diag << "'" << graph.getTasks()[t].getDisplayName() << "' -> ";
      diag << "'" << first.getDisplayName() << "'";
      for (unsigned t : llvm::drop_begin(cycle))
        diag.attachNote(graph.getTasks()[t].getLoc())
            << "task '" << graph.getTasks()[t].getDisplayName()
            << "' in the cycle";
      return failure();
    }

    for (EventOp event : graph.getEvents()) {
      bool produced = !graph.getProducers(event).empty();
      bool consumed = !graph.getConsumers(event).empty();
      if (!produced && !consumed) {
        event.emitOpError("event '")
            << event.getDisplayName() << "' is neither notified nor awaited";
        ok = false;
        continue;
      }
      // Wait count 0: complete from the start (an unfused launch of a
      // triggered task whose indptr an earlier kernel computed).
      if (!produced && event.getStaticWaitCount() == 0)
        continue;
      if (!produced) {
        TaskOp consumer = graph.getTasks()[graph.getConsumers(event)[0].task];
        InFlightDiagnostic diag = event.emitOpError("event '")
                                  << event.getDisplayName()
                                  << "' is awaited but never notified";
        diag.attachNote(consumer.getLoc())
            << "awaited by task '" << consumer.getDisplayName() << "'";
        ok = false;
        continue;
      }
      if (!consumed) {
        event.emitOpError("event '")
            << event.getDisplayName() << "' is notified but never awaited";
        ok = false;
        continue;
      }
      if (failed(verifyWaitCount(graph, event)))
        ok = false;
    }

    if (failed(verifyAllTasksCanRun(graph)))
      ok = false;
    return success(ok);
  }

  LogicalResult verifyWaitCount(const TaskGraph &graph, EventOp event) {
    if (event.getWaitCountTable())
      return success(); // Data-dependent: checked at run time.
    // Every rank notifies a ranked event, and maps may name the rank: the
    // counts are checked when the ranks launch, with the rank count bound.
    if (event.getRanked())
      return success();
    for (EdgeRef producer : graph.getProducers(event)) {
      TaskOp task = graph.getTasks()[producer.task];
      if (cast<AffineMapAttr>(task.getOutMaps()[producer.edge])
              .getValue()
              .getNumSymbols()) {
        event.emitWarning("the fan-in of event '")
            << event.getDisplayName() << "' depends on the rank (task '"
            << task.getDisplayName()
            << "' maps onto it with the rank symbol); its wait count is "
               "checked when the ranks launch";
        return success();
      }
    }
    // A triggered task runs a data-dependent number of instances, so the
    // notifications it sends can only be matched by a data-dependent count.
    for (EdgeRef producer : graph.getProducers(event)) {
      TaskOp task = graph.getTasks()[producer.task];
      if (!task.getTriggerEvent())
        continue;
      InFlightDiagnostic diag =
          event.emitOpError("event '")
          << event.getDisplayName()
          << "' is notified by a task with a data-dependent trigger, which "
             "runs a data-dependent number of instances: its wait count "
             "must be a table (`from %counts : memref<...>`)";
      diag.attachNote(task.getLoc())
          << "notified by task '" << task.getDisplayName() << "'";
      return failure();
    }
    std::optional<AffineExpr> count;
    if (std::optional<int64_t> value = event.getStaticWaitCount())
      count = getAffineConstantExpr(*value, event.getContext());
    else
      count = graph.getSymbolicExpr(event.getWaitCount());

    FanIn fanIn = computeFanIn(graph, event);
    GraphOp graphOp = event->getParentOfType<GraphOp>();
    if (fanIn.perCoordinate) {
      if (!count) {
        event.emitWarning("wait count of event '")
            << event.getDisplayName()
            << "' is not an affine expression of the graph symbols; it "
               "cannot be checked against the fan-in "
            << printSymbolicExpr(*fanIn.perCoordinate, graphOp);
        return success();
      }
      AffineExpr diff = simplifyAffineExpr(*count - *fanIn.perCoordinate, 0,
                                           graphOp.getNumArguments());
      if (diff == getAffineConstantExpr(0, event.getContext()))
        return success();
      // Products of symbols are not canonicalised by the affine simplifier
      // (`n*n + n` vs `n*(n+1)`): only a concrete disagreement is an error.
      std::optional<std::string> witness = findCounterexample(
          *count, *fanIn.perCoordinate, graphOp.getNumArguments());
      if (!witness)
        return success();
      InFlightDiagnostic diag =
          event.emitOpError("wait count ")
          << printSymbolicExpr(*count, graphOp) << " of event '"
          << event.getDisplayName() << "' differs from its fan-in "
          << printSymbolicExpr(*fanIn.perCoordinate, graphOp) << *witness;
      for (EdgeRef producer : graph.getProducers(event)) {
        TaskOp task = graph.getTasks()[producer.task];
        diag.attachNote(task.getLoc())
            << "notified by task '" << task.getDisplayName() << "' through "
            << task.getOutMaps()[producer.edge];
      }
      return failure();
    }

    // Irregular maps: enumerate when everything is static.
    SmallVector<int64_t> counts, shape;
    std::optional<int64_t> constantCount = event.getStaticWaitCount();
    if (constantCount && enumerateFanIn(graph, event, counts, shape)) {
      for (auto [linear, received] : llvm::enumerate(counts)) {
        if (received == *constantCount)
          continue;
        event.emitOpError("coordinate #")
            << linear << " of event '" << event.getDisplayName()
            << "' receives " << received
            << " notifications but its wait count is " << *constantCount;
        return failure();
      }
      return success();
    }
    event.emitWarning("the fan-in of event '")
        << event.getDisplayName() << "' cannot be computed at compile time ("
        << fanIn.unknownReason
        << "); its wait count is checked when the graph is launched";
    return success();
  }

  /// A task can never run if its grid is empty or if it waits on an event
  /// whose producers all can never run.
  LogicalResult verifyAllTasksCanRun(const TaskGraph &graph) {
    SmallVector<TaskOp> tasks = graph.getTasks();
    SmallVector<bool> dead(tasks.size(), false);
    SmallVector<std::string> why(tasks.size());
    for (auto [t, task] : llvm::enumerate(tasks))
      for (auto [d, extent] : llvm::enumerate(task.getStaticGrid()))
        if (extent == 0) {
          dead[t] = true;
          why[t] = "its grid dimension " + std::to_string(d) + " is empty";
        }
    bool changed = true;
    while (changed) {
      changed = false;
      for (auto [t, task] : llvm::enumerate(tasks)) {
        if (dead[t])
          continue;
        SmallVector<Value> awaited(task.getInEvents());
        if (Value trigger = task.getTriggerEvent())
          awaited.push_back(trigger);
        for (Value event : awaited) {
          auto eventOp = cast<EventOp>(event.getDefiningOp());
          ArrayRef<EdgeRef> producers = graph.getProducers(eventOp);
          if (producers.empty())
            continue; // Reported on the event already.
          if (llvm::all_of(producers,
                           [&](EdgeRef p) { return dead[p.task]; })) {
            dead[t] = true;
            why[t] = "it waits on event '" + eventOp.getDisplayName().str() +
                     "' whose producers can never run";
            changed = true;
            break;
          }
        }
      }
    }
    bool ok = true;
    for (auto [t, task] : llvm::enumerate(tasks))
      if (dead[t]) {
        task.emitOpError("task '")
            << task.getDisplayName() << "' can never run: " << why[t];
        ok = false;
      }
    return success(ok);
  }
};

} // namespace
