//===- StaticSchedule.cpp - Tasks to a static worker loop -----------------===//
//
// Part of ETC, the Event Tensor Compiler.
//
//===----------------------------------------------------------------------===//

#include "etc/Dialect/ETensor/Transforms/GraphAnalysis.h"
#include "etc/Dialect/ETensor/Transforms/Passes.h"
#include "mlir/Dialect/Affine/IR/AffineOps.h"
#include "mlir/Dialect/Affine/Utils.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/IR/Builders.h"

namespace mlir::etensor {
#define GEN_PASS_DEF_ETENSORSTATICSCHEDULE
#include "etc/Dialect/ETensor/Transforms/Passes.h.inc"
} // namespace mlir::etensor

using namespace mlir;
using namespace mlir::etensor;

/// The event coordinates that `map` sends grid point `coords` to, as arith
/// ops (identity results reuse the coordinate itself); the map's symbol, if
/// any, is the task's rank.
static SmallVector<Value> applyEdgeMap(OpBuilder &builder, Location loc,
                                       AffineMap map, ValueRange coords,
                                       TaskOp task) {
  SmallVector<Value> symbols;
  if (map.getNumSymbols())
    symbols.push_back(task.getRank());
  SmallVector<Value> results;
  for (AffineExpr expr : map.getResults()) {
    if (auto dim = dyn_cast<AffineDimExpr>(expr)) {
      results.push_back(coords[dim.getPosition()]);
      continue;
    }
    if (auto symbol = dyn_cast<AffineSymbolExpr>(expr)) {
      results.push_back(symbols[symbol.getPosition()]);
      continue;
    }
    results.push_back(
        affine::expandAffineExpr(builder, loc, expr, coords, symbols));
  }
  return results;
}

namespace {
struct ETensorStaticSchedulePass
    : public etensor::impl::ETensorStaticScheduleBase<
          ETensorStaticSchedulePass> {
  void runOnOperation() override {
    getOperation().walk([&](GraphOp graph) {
      if (failed(schedule(graph)))
        signalPassFailure();
    });
  }

  LogicalResult schedule(GraphOp graphOp) {
    TaskGraph graph(graphOp);
    SmallVector<unsigned> cycle;
    FailureOr<SmallVector<unsigned>> order = graph.topologicalOrder(cycle);
    if (failed(order))
      return graphOp.emitOpError("has a dependency cycle; run "
                                 "etensor-verify-graph for details");

    OpBuilder builder(graphOp.getContext());
    builder.setInsertionPointToEnd(&graphOp.getBodyBlock());
    // The counters a task draws its instances from, which nothing waits on
    // or notifies: an implicit event `<kind>.<task>` of count 1.
    auto drawCounters = [&](TaskOp task, StringRef kind, int64_t extent,
                            ValueRange sizes) {
      return EventOp::create(builder, task.getLoc(),
                             EventType::get(builder.getContext(), {extent}),
                             sizes, builder.getI64IntegerAttr(1),
                             /*wait_count=*/Value(),
                             /*wait_count_table=*/Value(), /*ranked=*/false,
                             builder.getStringAttr(
                                 (kind + "." + task.getDisplayName()).str()))
          .getEvent();
    };
    // A ticketed task's instances are handed out by one counter; a pooled
    // task's pools by a counter per pool (per value of grid coordinate
    // `pool_dim`, or one).
    DenseMap<Operation *, Value> tickets, pools;
    for (TaskOp task : graph.getTasks()) {
      if (task.getTicketed())
        tickets[task.getOperation()] =
            drawCounters(task, "ticket", 1, ValueRange());
      if (!task.getPooled())
        continue;
      int64_t extent = 1;
      SmallVector<Value> sizes;
      if (IntegerAttr dim = task.getPoolDimAttr()) {
        OpFoldResult grid = task.getMixedGrid()[dim.getInt()];
        if (auto value = dyn_cast<Value>(grid)) {
          extent = ShapedType::kDynamic;
          sizes.push_back(value);
        } else {
          extent = cast<IntegerAttr>(cast<Attribute>(grid)).getInt();
        }
      }
      pools[task.getOperation()] = drawCounters(task, "pool", extent, sizes);
    }
    auto worker = WorkerOp::create(builder, graphOp.getLoc(),
                                   ScheduleKind::Static, /*queue=*/Value());
    Block *workerBody = builder.createBlock(&worker.getBody());

    for (auto [number, taskIndex] : llvm::enumerate(*order)) {
      TaskOp task = graph.getTasks()[taskIndex];
      Location loc = task.getLoc();
      builder.setInsertionPointToEnd(workerBody);
      // A triggered task keeps its trigger: the lowering finds the
      // instance's coordinate (the block's second argument) in the indptr
      // table, then waits for the trigger event at that coordinate.
      auto dispatch = DispatchOp::create(
          builder, loc, builder.getI64IntegerAttr(number),
          task.getDynamicGrid(), task.getStaticGridAttr(),
          task.getTriggerEvent(), task.getTriggerIndptr(),
          tickets.lookup(task.getOperation()),
          pools.lookup(task.getOperation()), task.getPoolDimAttr(),
          task.getSharedRegionAttr(), task.getGuardedIndptrAttr());
      dispatch->setAttr("name", builder.getStringAttr(task.getDisplayName()));
      Block *body = builder.createBlock(&dispatch.getBody());
      SmallVector<Value> coords;
      for (int64_t d = 0; d < task.getCoordinateCount(); ++d)
        coords.push_back(body->addArgument(builder.getIndexType(), loc));
      builder.setInsertionPointToStart(body);
      // Casts of the buffers first: nothing may separate the waits and the
      // call.
      SmallVector<Value> callArgs(coords);
      llvm::append_range(callArgs, castArgsToCallee(builder, task));
      // The prefetch before the waits, or after the first prefetch_after.
      callPrefetch(builder, task, callArgs);
      forEachInEdgeWithPrefetch(
          builder, task, callArgs, [&](Value event, AffineMap map) {
            WaitOp::create(builder, loc, event,
                           applyEdgeMap(builder, loc, map, coords, task));
          });
      func::CallOp::create(builder, loc, task.getCallee(), TypeRange(),
                           callArgs);
      for (auto [event, map] :
           llvm::zip(task.getOutEvents(), task.getOutMaps()))
        NotifyOp::create(builder, loc, /*completed=*/Type(), event,
                         applyEdgeMap(builder, loc,
                                      cast<AffineMapAttr>(map).getValue(),
                                      coords, task));
      YieldOp::create(builder, loc);
    }
    for (TaskOp task : graph.getTasks())
      task.erase();
    return success();
  }
};
} // namespace
