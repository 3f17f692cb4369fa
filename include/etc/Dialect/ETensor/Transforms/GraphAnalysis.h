//===- GraphAnalysis.h - Task/event structure of a graph --------*- C++ -*-===//
//
// Part of ETC, the Event Tensor Compiler.
//
// The task-level view of an etensor.graph that the verifier and the
// scheduling passes share: which tasks produce and consume each event, the
// task dependency DAG, and symbolic extents as affine expressions of the
// graph's index arguments.
//
//===----------------------------------------------------------------------===//

#ifndef ETC_DIALECT_ETENSOR_TRANSFORMS_GRAPHANALYSIS_H
#define ETC_DIALECT_ETENSOR_TRANSFORMS_GRAPHANALYSIS_H

#include "etc/Dialect/ETensor/IR/ETensorOps.h"
#include "mlir/IR/AffineExpr.h"
#include "mlir/IR/Builders.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/SmallVector.h"

namespace mlir::etensor {

/// One edge end: task `task` touches the event through edge number `edge`
/// (`edge == kTriggerEdge` for a data-dependent trigger).
/// Whether an out-edge map shifts a grid dimension forward (`(l, i) ->
/// (l + 1)`): a loop-carried dependency, left out of the task order.
bool isLoopCarried(AffineMap map);

/// The task's arguments for a call to its device function, each memref cast
/// to the parameter type where the task passes a more static one.
SmallVector<Value> castArgsToCallee(OpBuilder &builder, TaskOp task);

/// Calls the task's `prefetch` function, if it has one, with `callArgs`,
/// when `afterWaits` is its place: the number of in-edge waits before it
/// (its `prefetch_after`, 0 by default).
void callPrefetch(OpBuilder &builder, TaskOp task, ValueRange callArgs,
                  int64_t afterWaits = 0);

/// Visits the task's in-edges in order (`inEdge(event, map)`, which may
/// emit a wait), calling a prefetch placed after the first `prefetch_after`
/// of them there (one placed before them is the caller's:
/// `callPrefetch(..., 0)`).
void forEachInEdgeWithPrefetch(
    OpBuilder &builder, TaskOp task, ValueRange callArgs,
    llvm::function_ref<void(Value event, AffineMap map)> inEdge);

struct EdgeRef {
  static constexpr unsigned kTriggerEdge = ~0u;
  unsigned task;
  unsigned edge;
};

class TaskGraph {
public:
  explicit TaskGraph(GraphOp graph);

  GraphOp getGraph() { return graph; }
  SmallVector<TaskOp> getTasks() const { return tasks; }
  SmallVector<EventOp> getEvents() const { return events; }
  ArrayRef<EdgeRef> getProducers(EventOp event) const;
  ArrayRef<EdgeRef> getConsumers(EventOp event) const;
  /// Tasks that must finish some instance before task `task` can start.
  ArrayRef<unsigned> getPredecessors(unsigned task) const {
    return predecessors[task];
  }

  /// A topological order of the tasks (Kahn's algorithm, ties broken by
  /// graph order so the numbering is stable), or failure with `cycle` set to
  /// the tasks of one dependency cycle, in order.
  FailureOr<SmallVector<unsigned>>
  topologicalOrder(SmallVectorImpl<unsigned> &cycle) const;

  /// `value` as an affine expression of the graph's index arguments (symbol
  /// k is argument k), through constants and arith add/sub/mul/div/rem;
  /// std::nullopt when it is computed some other way.
  std::optional<AffineExpr> getSymbolicExpr(Value value) const;
  std::optional<AffineExpr> getSymbolicExpr(OpFoldResult value) const;

private:
  mutable GraphOp graph;
  SmallVector<TaskOp> tasks;
  SmallVector<EventOp> events;
  DenseMap<Operation *, SmallVector<EdgeRef>> producers, consumers;
  SmallVector<SmallVector<unsigned>> predecessors, successors;
};

/// Prints `expr` with the graph's argument names (`%n`) for diagnostics.
std::string printSymbolicExpr(AffineExpr expr, GraphOp graph);

} // namespace mlir::etensor

#endif // ETC_DIALECT_ETENSOR_TRANSFORMS_GRAPHANALYSIS_H
