//===- GraphAnalysis.cpp - Task/event structure of a graph ----------------===//
//
// Part of ETC, the Event Tensor Compiler.
//
//===----------------------------------------------------------------------===//

#include "etc/Dialect/ETensor/Transforms/GraphAnalysis.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/IR/AffineMap.h"
#include "mlir/IR/AsmState.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/Support/raw_ostream.h"

using namespace mlir;
using namespace mlir::etensor;

TaskGraph::TaskGraph(GraphOp graph) : graph(graph) {
  DenseMap<Operation *, unsigned> taskIndex;
  for (Operation &op : graph.getBodyBlock()) {
    if (auto event = dyn_cast<EventOp>(op)) {
      events.push_back(event);
      producers[event];
      consumers[event];
    } else if (auto task = dyn_cast<TaskOp>(op)) {
      taskIndex[task] = tasks.size();
      tasks.push_back(task);
    }
  }
  predecessors.resize(tasks.size());
  successors.resize(tasks.size());
  for (auto [t, task] : llvm::enumerate(tasks)) {
    for (auto [e, event] : llvm::enumerate(task.getOutEvents()))
      producers[event.getDefiningOp()].push_back({(unsigned)t, (unsigned)e});
    for (auto [e, event] : llvm::enumerate(task.getInEvents()))
      consumers[event.getDefiningOp()].push_back({(unsigned)t, (unsigned)e});
    if (Value trigger = task.getTriggerEvent())
      consumers[trigger.getDefiningOp()].push_back(
          {(unsigned)t, EdgeRef::kTriggerEdge});
  }
  for (EventOp event : events)
    for (EdgeRef producer : producers[event]) {
      // A shifted out-edge (`(l, i) -> (l + 1)`) is loop-carried: it feeds a
      // later phase of the consumers and does not order the tasks.
      if (isLoopCarried(cast<AffineMapAttr>(
                            tasks[producer.task].getOutMaps()[producer.edge])
                            .getValue()))
        continue;
      for (EdgeRef consumer : consumers[event]) {
        if (!llvm::is_contained(successors[producer.task], consumer.task))
          successors[producer.task].push_back(consumer.task);
        if (!llvm::is_contained(predecessors[consumer.task], producer.task))
          predecessors[consumer.task].push_back(producer.task);
      }
    }
}

bool mlir::etensor::isLoopCarried(AffineMap map) {
  return llvm::any_of(map.getResults(), [](AffineExpr expr) {
    auto sum = dyn_cast<AffineBinaryOpExpr>(expr);
    if (!sum || sum.getKind() != AffineExprKind::Add)
      return false;
    auto offset = dyn_cast<AffineConstantExpr>(sum.getRHS());
    return isa<AffineDimExpr>(sum.getLHS()) && offset && offset.getValue() > 0;
  });
}

ArrayRef<EdgeRef> TaskGraph::getProducers(EventOp event) const {
  return producers.find(event)->second;
}

ArrayRef<EdgeRef> TaskGraph::getConsumers(EventOp event) const {
  return consumers.find(event)->second;
}

FailureOr<SmallVector<unsigned>>
TaskGraph::topologicalOrder(SmallVectorImpl<unsigned> &cycle) const {
  unsigned n = tasks.size();
  SmallVector<unsigned> inDegree(n, 0);
  for (unsigned t = 0; t < n; ++t)
    inDegree[t] = predecessors[t].size();
  SmallVector<unsigned> order;
  SmallVector<bool> done(n, false);
  while (order.size() < n) {
    // Lowest graph index among the ready tasks keeps the order stable.
    std::optional<unsigned> next;
    for (unsigned t = 0; t < n && !next; ++t)
      if (!done[t] && inDegree[t] == 0)
        next = t;
    if (!next)
      break;
    done[*next] = true;
    order.push_back(*next);
    for (unsigned succ : successors[*next])
      --inDegree[succ];
  }
  if (order.size() == n)
    return order;

  // Walk predecessors among the remaining tasks until one repeats.
  unsigned start = 0;
  while (done[start])
    ++start;
  SmallVector<unsigned> path;
  DenseMap<unsigned, unsigned> position;
  unsigned current = start;
  while (!position.count(current)) {
    position[current] = path.size();
    path.push_back(current);
    for (unsigned pred : predecessors[current])
      if (!done[pred]) {
        current = pred;
        break;
      }
  }
  cycle.assign(path.begin() + position[current], path.end());
  std::reverse(cycle.begin(), cycle.end());
  // Start the reported cycle at its first task in graph order.
  std::rotate(cycle.begin(), llvm::min_element(cycle), cycle.end());
  return failure();
}

std::optional<AffineExpr> TaskGraph::getSymbolicExpr(Value value) const {
  MLIRContext *ctx = value.getContext();
  if (auto arg = dyn_cast<BlockArgument>(value)) {
    if (arg.getOwner() == &graph.getBodyBlock())
      return getAffineSymbolExpr(arg.getArgNumber(), ctx);
    return std::nullopt;
  }
  Operation *op = value.getDefiningOp();
  if (auto constant = dyn_cast<arith::ConstantIndexOp>(op))
    return getAffineConstantExpr(constant.value(), ctx);
  if (op->getNumOperands() != 2)
    return std::nullopt;
  std::optional<AffineExpr> lhs = getSymbolicExpr(op->getOperand(0));
  std::optional<AffineExpr> rhs = getSymbolicExpr(op->getOperand(1));
  if (!lhs || !rhs)
    return std::nullopt;
  auto rhsConstant = dyn_cast<AffineConstantExpr>(*rhs);
  if (isa<arith::AddIOp>(op))
    return *lhs + *rhs;
  if (isa<arith::SubIOp>(op))
    return *lhs - *rhs;
  if (isa<arith::MulIOp>(op))
    return *lhs * *rhs;
  if (isa<arith::DivUIOp, arith::FloorDivSIOp, arith::DivSIOp>(op) &&
      rhsConstant && rhsConstant.getValue() > 0)
    return lhs->floorDiv(*rhs);
  if (isa<arith::CeilDivUIOp, arith::CeilDivSIOp>(op) && rhsConstant &&
      rhsConstant.getValue() > 0)
    return lhs->ceilDiv(*rhs);
  if (isa<arith::RemUIOp, arith::RemSIOp>(op) && rhsConstant &&
      rhsConstant.getValue() > 0)
    return *lhs % *rhs;
  return std::nullopt;
}

std::optional<AffineExpr> TaskGraph::getSymbolicExpr(OpFoldResult value) const {
  if (auto attr = dyn_cast<Attribute>(value))
    return getAffineConstantExpr(cast<IntegerAttr>(attr).getInt(),
                                 graph.getContext());
  return getSymbolicExpr(cast<Value>(value));
}

std::string mlir::etensor::printSymbolicExpr(AffineExpr expr, GraphOp graph) {
  std::string text;
  llvm::raw_string_ostream os(text);
  expr.print(os);
  // Replace s<k> by the argument's SSA name: %arg<k> unless it has a loc name.
  std::string result;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == 's' && i + 1 < text.size() && isdigit(text[i + 1]) &&
        (i == 0 || !isalnum(text[i - 1]))) {
      size_t j = i + 1;
      while (j < text.size() && isdigit(text[j]))
        ++j;
      unsigned arg = std::stoul(text.substr(i + 1, j - i - 1));
      result += "%arg" + std::to_string(arg);
      i = j - 1;
      continue;
    }
    result += text[i];
  }
  (void)graph;
  return result;
}

SmallVector<Value> mlir::etensor::castArgsToCallee(OpBuilder &builder,
                                                   TaskOp task) {
  auto callee = SymbolTable::lookupNearestSymbolFrom<func::FuncOp>(
      task, task.getCalleeAttr());
  ArrayRef<Type> params = callee.getFunctionType().getInputs().drop_front(
      task.getCoordinateCount());
  SmallVector<Value> args;
  for (auto [arg, param] : llvm::zip(task.getArgs(), params))
    args.push_back(
        arg.getType() == param
            ? arg
            : memref::CastOp::create(builder, task.getLoc(), param, arg)
                  .getResult());
  return args;
}

void mlir::etensor::callPrefetch(OpBuilder &builder, TaskOp task,
                                 ValueRange callArgs, int64_t afterWaits) {
  FlatSymbolRefAttr prefetch = task.getPrefetchAttr();
  if (!prefetch || task.getPrefetchAfter().value_or(0) != afterWaits)
    return;
  auto call = func::CallOp::create(builder, task.getLoc(), prefetch,
                                   TypeRange(), callArgs);
  call->setAttr(kPrefetchAttrName, builder.getUnitAttr());
}

void mlir::etensor::forEachInEdgeWithPrefetch(
    OpBuilder &builder, TaskOp task, ValueRange callArgs,
    llvm::function_ref<void(Value event, AffineMap map)> inEdge) {
  // A prefetch after in-edges may read what their producers wrote.
  for (auto [k, edge] :
       llvm::enumerate(llvm::zip(task.getInEvents(), task.getInMaps()))) {
    auto [event, map] = edge;
    inEdge(event, cast<AffineMapAttr>(map).getValue());
    callPrefetch(builder, task, callArgs, static_cast<int64_t>(k) + 1);
  }
}
