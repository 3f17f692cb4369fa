//===- ETensorOps.cpp - Event tensor operations ---------------------------===//
//
// Part of ETC, the Event Tensor Compiler.
//
//===----------------------------------------------------------------------===//

#include "etc/Dialect/ETensor/IR/ETensorOps.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Utils/StaticValueUtils.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/OpImplementation.h"
#include "mlir/Interfaces/FunctionImplementation.h"
#include "mlir/Interfaces/ViewLikeInterface.h"
#include "llvm/ADT/SmallSet.h"

using namespace mlir;
using namespace mlir::etensor;

#include "etc/Dialect/ETensor/IR/ETensorEnums.cpp.inc"

//===----------------------------------------------------------------------===//
// Custom directives
//===----------------------------------------------------------------------===//

/// wait-count ::= integer | ssa-use | `from` ssa-use `:` memref-type
static ParseResult
parseWaitCount(OpAsmParser &parser, IntegerAttr &staticCount,
               std::optional<OpAsmParser::UnresolvedOperand> &count,
               std::optional<OpAsmParser::UnresolvedOperand> &table,
               Type &tableType) {
  if (succeeded(parser.parseOptionalKeyword("from"))) {
    OpAsmParser::UnresolvedOperand operand;
    if (parser.parseOperand(operand) || parser.parseColonType(tableType))
      return failure();
    table = operand;
    return success();
  }
  OpAsmParser::UnresolvedOperand operand;
  OptionalParseResult maybeOperand = parser.parseOptionalOperand(operand);
  if (maybeOperand.has_value()) {
    if (failed(*maybeOperand))
      return failure();
    count = operand;
    return success();
  }
  int64_t value;
  if (parser.parseInteger(value))
    return failure();
  staticCount = parser.getBuilder().getI64IntegerAttr(value);
  return success();
}

static void printWaitCount(OpAsmPrinter &printer, Operation *,
                           IntegerAttr staticCount, Value count, Value table,
                           Type tableType) {
  if (table) {
    printer << "from " << table << " : " << tableType;
    return;
  }
  if (count) {
    printer << count;
    return;
  }
  if (staticCount)
    printer << staticCount.getInt();
}

/// edges ::= (keyword `(` ssa-use `[` affine-map `]` `:` type
///            (`,` ssa-use `[` affine-map `]` `:` type)* `)`)?
static ParseResult
parseEdges(OpAsmParser &parser, StringRef keyword,
           SmallVectorImpl<OpAsmParser::UnresolvedOperand> &events,
           SmallVectorImpl<Type> &types, ArrayAttr &maps) {
  SmallVector<Attribute> mapAttrs;
  if (succeeded(parser.parseOptionalKeyword(keyword))) {
    auto parseOne = [&]() -> ParseResult {
      OpAsmParser::UnresolvedOperand event;
      AffineMap map;
      Type type;
      if (parser.parseOperand(event) || parser.parseLSquare() ||
          parser.parseAffineMap(map) || parser.parseRSquare() ||
          parser.parseColonType(type))
        return failure();
      events.push_back(event);
      types.push_back(type);
      mapAttrs.push_back(AffineMapAttr::get(map));
      return success();
    };
    if (parser.parseCommaSeparatedList(OpAsmParser::Delimiter::Paren, parseOne))
      return failure();
  }
  maps = parser.getBuilder().getArrayAttr(mapAttrs);
  return success();
}

static void printEdges(OpAsmPrinter &printer, StringRef keyword,
                       OperandRange events, TypeRange types, ArrayAttr maps) {
  if (events.empty())
    return;
  printer << keyword << "(";
  for (auto [i, event] : llvm::enumerate(events)) {
    if (i)
      printer << ", ";
    printer << event << "[";
    cast<AffineMapAttr>(maps[i]).getValue().print(printer.getStream());
    printer << "] : " << types[i];
  }
  printer << ")";
}

/// Both edge lists; each is omitted when empty.
static ParseResult
parseEdges(OpAsmParser &parser,
           SmallVectorImpl<OpAsmParser::UnresolvedOperand> &inEvents,
           SmallVectorImpl<Type> &inTypes, ArrayAttr &inMaps,
           SmallVectorImpl<OpAsmParser::UnresolvedOperand> &outEvents,
           SmallVectorImpl<Type> &outTypes, ArrayAttr &outMaps) {
  if (parseEdges(parser, "ins", inEvents, inTypes, inMaps))
    return failure();
  return parseEdges(parser, "outs", outEvents, outTypes, outMaps);
}

static void printEdges(OpAsmPrinter &printer, Operation *,
                       OperandRange inEvents, TypeRange inTypes,
                       ArrayAttr inMaps, OperandRange outEvents,
                       TypeRange outTypes, ArrayAttr outMaps) {
  printEdges(printer, "ins", inEvents, inTypes, inMaps);
  if (!inEvents.empty() && !outEvents.empty())
    printer << " ";
  printEdges(printer, "outs", outEvents, outTypes, outMaps);
}

/// Checks that constant coordinates address inside the static dimensions of
/// `type`; `?` dimensions are checked at run time.
static LogicalResult verifyCoordinates(Operation *op, EventType type,
                                       ValueRange indices) {
  if (static_cast<int64_t>(indices.size()) != type.getRank())
    return op->emitOpError("expects ") << type.getRank() << " coordinates for "
                                       << type << ", got " << indices.size();
  for (auto [dim, index] : llvm::enumerate(indices)) {
    std::optional<int64_t> value = getConstantIntValue(index);
    int64_t extent = type.getShape()[dim];
    if (value &&
        (*value < 0 || (!ShapedType::isDynamic(extent) && *value >= extent)))
      return op->emitOpError("coordinate ")
             << *value << " is out of bounds for dimension " << dim << " of "
             << type;
  }
  return success();
}

//===----------------------------------------------------------------------===//
// GraphOp
//===----------------------------------------------------------------------===//

ParseResult GraphOp::parse(OpAsmParser &parser, OperationState &result) {
  auto buildType = [](Builder &builder, ArrayRef<Type> argTypes,
                      ArrayRef<Type> results,
                      function_interface_impl::VariadicFlag, std::string &) {
    return builder.getFunctionType(argTypes, results);
  };
  return function_interface_impl::parseFunctionOp(
      parser, result, /*allowVariadic=*/false,
      getFunctionTypeAttrName(result.name), buildType,
      getArgAttrsAttrName(result.name), getResAttrsAttrName(result.name));
}

void GraphOp::print(OpAsmPrinter &printer) {
  function_interface_impl::printFunctionOp(
      printer, *this, /*isVariadic=*/false, getFunctionTypeAttrName(),
      getArgAttrsAttrName(), getResAttrsAttrName());
}

LogicalResult GraphOp::verify() {
  if (!getResultTypes().empty())
    return emitOpError("a graph has no results; write outputs to its "
                       "memref arguments");
  for (auto [i, type] : llvm::enumerate(getArgumentTypes()))
    if (!isa<IndexType, MemRefType>(type))
      return emitOpError("argument #")
             << i << " must be an index symbol or a memref buffer, got "
             << type;
  if (getBody().empty())
    return emitOpError("expects a body");
  if (auto blockSize =
          (*this)->getAttrOfType<IntegerAttr>("etensor.block_size"))
    if (blockSize.getInt() <= 0 || blockSize.getInt() > 1024 ||
        blockSize.getInt() % 32 != 0)
      return emitOpError("etensor.block_size must be a multiple of 32 in "
                         "[32, 1024], got ")
             << blockSize.getInt();
  return success();
}

//===----------------------------------------------------------------------===//
// EventOp
//===----------------------------------------------------------------------===//

LogicalResult EventOp::verify() {
  EventType type = getEventType();
  if (static_cast<int64_t>(getSizes().size()) != type.getNumDynamicDims())
    return emitOpError("expects one size operand per '?' dimension of ")
           << type << " (" << type.getNumDynamicDims() << "), got "
           << getSizes().size();
  int forms = (getStaticWaitCount() ? 1 : 0) + (getWaitCount() ? 1 : 0) +
              (getWaitCountTable() ? 1 : 0);
  if (forms != 1)
    return emitOpError("expects exactly one wait count: a constant, an index "
                       "value or a table");
  // I64Attr accessors return unsigned values: check the signed attribute.
  if (IntegerAttr count = getStaticWaitCountAttr(); count && count.getInt() < 0)
    return emitOpError("wait count must be non-negative, got ")
           << count.getInt();
  if (getRanked()) {
    if (type.getRank() < 1)
      return emitOpError("a ranked event needs dimension 0 for the rank, got ")
             << type;
    if (getWaitCountTable())
      return emitOpError("a ranked event cannot read its wait counts from a "
                         "table: its notifications come from every rank");
  }
  if (Value table = getWaitCountTable()) {
    auto tableType = cast<MemRefType>(table.getType());
    if (!tableType.getElementType().isSignlessInteger())
      return emitOpError("wait count table must hold signless integers, got ")
             << tableType;
    if (tableType.getRank() != type.getRank())
      return emitOpError("wait count table ")
             << tableType << " must have the event's rank " << type.getRank();
    for (auto [dim, extent] : llvm::enumerate(type.getShape()))
      if (!ShapedType::isDynamic(extent) && !tableType.isDynamicDim(dim) &&
          tableType.getDimSize(dim) != extent)
        return emitOpError("wait count table ")
               << tableType << " does not match " << type << " in dimension "
               << dim;
  }
  return success();
}

OpFoldResult EventOp::getMixedSize(unsigned dim) {
  EventType type = getEventType();
  int64_t extent = type.getShape()[dim];
  if (!ShapedType::isDynamic(extent))
    return Builder(getContext()).getIndexAttr(extent);
  unsigned dynamicIndex =
      llvm::count_if(type.getShape().take_front(dim), ShapedType::isDynamic);
  return getSizes()[dynamicIndex];
}

StringRef EventOp::getDisplayName() {
  if (std::optional<StringRef> name = getName())
    return *name;
  return "<unnamed>";
}

//===----------------------------------------------------------------------===//
// TaskOp
//===----------------------------------------------------------------------===//

/// Whether every floordiv, ceildiv and mod in `expr` divides by a positive
/// constant: the schedules expand maps into arith ops, which cannot lower any
/// other division.
static bool hasPositiveDivisors(AffineExpr expr) {
  bool positive = true;
  expr.walk([&](AffineExpr e) {
    if (e.getKind() != AffineExprKind::FloorDiv &&
        e.getKind() != AffineExprKind::CeilDiv &&
        e.getKind() != AffineExprKind::Mod)
      return;
    auto divisor =
        dyn_cast<AffineConstantExpr>(cast<AffineBinaryOpExpr>(e).getRHS());
    if (!divisor || divisor.getValue() <= 0)
      positive = false;
  });
  return positive;
}

static LogicalResult verifyEdges(TaskOp task, StringRef kind,
                                 OperandRange events, ArrayAttr maps) {
  if (events.size() != maps.size())
    return task.emitOpError("expects one map per ")
           << kind << " event, got " << maps.size() << " maps for "
           << events.size() << " events";
  for (auto [i, event, mapAttr] : llvm::enumerate(events, maps)) {
    AffineMap map = cast<AffineMapAttr>(mapAttr).getValue();
    auto type = cast<EventType>(event.getType());
    if (map.getNumSymbols() > (task.getRank() ? 1 : 0))
      return task.emitOpError()
             << kind << " map #" << i << " " << AffineMapAttr::get(map)
             << (task.getRank() ? " may use one symbol (the rank)"
                                : " must not use symbols (a task with "
                                  "`rank(%r)` may use one: the rank)");
    auto eventOp = event.getDefiningOp<EventOp>();
    if (kind == "in" && eventOp && eventOp.getRanked() &&
        map.getNumResults() > 0 &&
        map.getResult(0) != getAffineSymbolExpr(0, task.getContext()))
      return task.emitOpError()
             << "in map #" << i << " " << AffineMapAttr::get(map)
             << " on ranked event '" << eventOp.getDisplayName()
             << "' must address dimension 0 with the rank symbol: a rank "
                "waits on its own copy of the counters";
    if (static_cast<int64_t>(map.getNumDims()) != task.getCoordinateCount())
      return task.emitOpError()
             << kind << " map #" << i << " " << AffineMapAttr::get(map)
             << " has " << map.getNumDims() << " dimensions but the task has "
             << task.getCoordinateCount()
             << (task.getTriggerEvent()
                     ? " (the instance and its trigger coordinate)"
                     : " (its grid rank)");
    if (static_cast<int64_t>(map.getNumResults()) != type.getRank())
      return task.emitOpError()
             << kind << " map #" << i << " " << AffineMapAttr::get(map)
             << " has " << map.getNumResults() << " results but event " << type
             << " has rank " << type.getRank();
    // Constant results must land inside static dimensions.
    for (auto [dim, expr] : llvm::enumerate(map.getResults())) {
      if (!hasPositiveDivisors(expr))
        return task.emitOpError()
               << kind << " map #" << i << " " << AffineMapAttr::get(map)
               << " must divide only by positive constants";
      auto constant = dyn_cast<AffineConstantExpr>(expr);
      int64_t extent = type.getShape()[dim];
      if (constant &&
          (constant.getValue() < 0 ||
           (!ShapedType::isDynamic(extent) && constant.getValue() >= extent)))
        return task.emitOpError()
               << kind << " map #" << i << " " << AffineMapAttr::get(map)
               << " addresses coordinate " << constant.getValue()
               << " outside dimension " << dim << " of " << type;
    }
  }
  return success();
}

/// The rules `pooled` tasks and `pool(...)` dispatches share: `pool_dim`
/// names a grid dimension of a pooled op, and a pool is dealt by neither
/// tickets nor a trigger's table.
template <typename OpTy>
static LogicalResult verifyPool(OpTy op, bool pooled, IntegerAttr poolDim,
                                int64_t gridRank, bool ticketed,
                                Value trigger) {
  if (poolDim && !pooled)
    return op.emitOpError("pool_dim needs a pooled deal");
  if (!pooled)
    return success();
  if (poolDim && poolDim.getInt() >= gridRank)
    return op.emitOpError("pool_dim ")
           << poolDim.getInt() << " is not a dimension of the rank-" << gridRank
           << " grid";
  if (ticketed)
    return op.emitOpError("is dealt by tickets or by pools, not both");
  if (trigger)
    return op.emitOpError("with a data-dependent trigger cannot be pooled");
  return success();
}

LogicalResult TaskOp::verify() {
  if (failed(verifyListOfOperandsOrIntegers(*this, "grid", getGridRank(),
                                            getStaticGrid(), getDynamicGrid())))
    return failure();
  for (int64_t extent : getStaticGrid())
    if (!ShapedType::isDynamic(extent) && extent < 0)
      return emitOpError("grid extents must be non-negative, got ") << extent;
  if (failed(verifyEdges(*this, "in", getInEvents(), getInMaps())) ||
      failed(verifyEdges(*this, "out", getOutEvents(), getOutMaps())))
    return failure();
  if (Value trigger = getTriggerEvent()) {
    if (getGridRank() != 1)
      return emitOpError("a data-dependent trigger needs a 1-D task grid, "
                         "got rank ")
             << getGridRank();
    if (cast<EventType>(trigger.getType()).getRank() != 1)
      return emitOpError("a data-dependent trigger needs a 1-D event, got ")
             << trigger.getType();
    if (auto triggerOp = trigger.getDefiningOp<EventOp>();
        triggerOp && triggerOp.getRanked())
      return emitOpError("a data-dependent trigger cannot be a ranked event");
    // The coordinate is only known once the trigger fired; the in-edges are
    // awaited before that (they may guard the trigger's tables).
    for (auto [i, mapAttr] : llvm::enumerate(getInMaps()))
      if (cast<AffineMapAttr>(mapAttr).getValue().isFunctionOfDim(1))
        return emitOpError("in map #")
               << i << " " << mapAttr
               << " uses the trigger coordinate (dimension 1); only out-edges "
                  "may";
  }
  if (getGuardedIndptr() && !getTriggerEvent())
    return emitOpError("guarded_indptr needs a data-dependent trigger "
                       "(triggered_by)");
  if (failed(verifyPool(*this, getPooled(), getPoolDimAttr(), getGridRank(),
                        getTicketed(), getTriggerEvent())))
    return failure();
  SmallVector<Value> events(getInEvents());
  llvm::append_range(events, getOutEvents());
  if (Value trigger = getTriggerEvent())
    events.push_back(trigger);
  // The graph analysis follows edges to their etensor.event declarations.
  for (Value event : events)
    if (event.getParentRegion() != (*this)->getParentRegion() ||
        !event.getDefiningOp<EventOp>())
      return emitOpError("events must be declared by etensor.event in the "
                         "same graph");
  return success();
}

LogicalResult TaskOp::verifySymbolUses(SymbolTableCollection &symbolTable) {
  auto callee =
      symbolTable.lookupNearestSymbolFrom<func::FuncOp>(*this, getCalleeAttr());
  if (!callee)
    return emitOpError("callee '")
           << getCallee() << "' does not name a func.func device function";
  FunctionType fnType = callee.getFunctionType();
  if (fnType.getNumResults() != 0)
    return emitOpError("device function '")
           << getCallee() << "' must not return values";
  int64_t coords = getCoordinateCount();
  int64_t expected = coords + getArgs().size();
  if (static_cast<int64_t>(fnType.getNumInputs()) != expected)
    return emitOpError("device function '")
           << getCallee() << "' takes " << fnType.getNumInputs()
           << " arguments, but a task with "
           << (getTriggerEvent()
                   ? "a data-dependent trigger (coordinates i, c)"
                   : "a rank-" + std::to_string(getGridRank()) + " grid")
           << " and " << getArgs().size() << " arguments passes " << expected;
  for (int64_t i = 0; i < coords; ++i)
    if (!fnType.getInput(i).isIndex())
      return emitOpError("argument #")
             << i << " of device function '" << getCallee()
             << "' is a grid coordinate and must be index, got "
             << fnType.getInput(i);
  for (auto [i, arg] : llvm::enumerate(getArgs()))
    if (!isGeneralisationOf(fnType.getInput(coords + i), arg.getType()))
      return emitOpError("argument #")
             << i << " has type " << arg.getType() << " but device function '"
             << getCallee() << "' expects " << fnType.getInput(coords + i);
  if (FlatSymbolRefAttr prefetchAttr = getPrefetchAttr()) {
    auto prefetch =
        symbolTable.lookupNearestSymbolFrom<func::FuncOp>(*this, prefetchAttr);
    if (!prefetch)
      return emitOpError("prefetch '")
             << prefetchAttr.getValue() << "' does not name a func.func";
    if (prefetch.getFunctionType() != fnType)
      return emitOpError("prefetch function '")
             << prefetchAttr.getValue() << "' has type "
             << prefetch.getFunctionType() << ", but the device function '"
             << getCallee() << "' has " << fnType
             << ": a prefetch takes the same arguments";
  }
  if (std::optional<int64_t> after = getPrefetchAfter()) {
    if (!getPrefetchAttr())
      return emitOpError("prefetch_after needs a prefetch function");
    if (getTriggerEvent())
      return emitOpError("prefetch_after: a triggered task runs its prefetch "
                         "once it has found its coordinate");
    if (*after > static_cast<int64_t>(getInEvents().size()))
      return emitOpError("prefetch_after = ")
             << *after << " exceeds the task's " << getInEvents().size()
             << " in-edges";
  }
  return success();
}

bool mlir::etensor::isGeneralisationOf(Type param, Type arg) {
  if (param == arg)
    return true;
  auto general = dyn_cast<MemRefType>(param);
  auto specific = dyn_cast<MemRefType>(arg);
  if (!general || !specific || general.getRank() != specific.getRank() ||
      general.getElementType() != specific.getElementType() ||
      general.getMemorySpace() != specific.getMemorySpace() ||
      !general.getLayout().isIdentity() || !specific.getLayout().isIdentity())
    return false;
  return llvm::all_of(llvm::zip(general.getShape(), specific.getShape()),
                      [](auto dims) {
                        auto [g, s] = dims;
                        return ShapedType::isDynamic(g) || g == s;
                      });
}

OpFoldResult TaskOp::getMixedExtent(unsigned dim) {
  return getMixedGrid()[dim];
}

SmallVector<OpFoldResult> TaskOp::getMixedGrid() {
  return getMixedValues(getStaticGrid(), getDynamicGrid(), getContext());
}

StringRef TaskOp::getDisplayName() {
  if (std::optional<StringRef> name = getName())
    return *name;
  return getCallee();
}

//===----------------------------------------------------------------------===//
// Schedule-level ops
//===----------------------------------------------------------------------===//

LogicalResult WaitOp::verify() {
  return verifyCoordinates(*this, cast<EventType>(getEvent().getType()),
                           getIndices());
}

LogicalResult NotifyOp::verify() {
  return verifyCoordinates(*this, cast<EventType>(getEvent().getType()),
                           getIndices());
}

LogicalResult PushOp::verify() {
  if (getTaskAttr().getInt() < 0)
    return emitOpError("task index must be non-negative, got ")
           << getTaskAttr().getInt();
  return success();
}

LogicalResult WorkerOp::verify() {
  bool dynamic = getSchedule() == ScheduleKind::Dynamic;
  if (dynamic != static_cast<bool>(getQueue()))
    return emitOpError(dynamic ? "a dynamic worker needs a queue"
                               : "a static worker takes no queue");
  // A std::set beyond 8 entries: any int64_t is a valid key, unlike in a
  // DenseSet, whose empty and tombstone keys are INT64_MAX and INT64_MIN.
  llvm::SmallSet<int64_t, 8> seen;
  for (Operation &op : getBody().front()) {
    auto dispatch = dyn_cast<DispatchOp>(op);
    if (!dispatch)
      return op.emitOpError("is not allowed in a worker body; expected "
                            "etensor.dispatch");
    int64_t task = dispatch.getTaskAttr().getInt();
    if (!seen.insert(task).second)
      return dispatch.emitOpError("task ") << task << " is dispatched twice";
  }
  return success();
}

LogicalResult DispatchOp::verify() {
  if (getTaskAttr().getInt() < 0)
    return emitOpError("task index must be non-negative, got ")
           << getTaskAttr().getInt();
  int64_t rank = getStaticGrid().size();
  if (failed(verifyListOfOperandsOrIntegers(*this, "grid", rank,
                                            getStaticGrid(), getDynamicGrid())))
    return failure();
  Block &body = getBody().front();
  if (failed(verifyPool(*this, static_cast<bool>(getPool()), getPoolDimAttr(),
                        rank, static_cast<bool>(getTicket()),
                        getTriggerEvent())))
    return failure();
  if (Value pool = getPool();
      pool && cast<EventType>(pool.getType()).getRank() != 1)
    return emitOpError("a pool needs a 1-D event, got ") << pool.getType();
  if (getGuardedIndptr() && !getTriggerEvent())
    return emitOpError("guarded_indptr needs a data-dependent trigger "
                       "(triggered_by)");
  if (getTriggerEvent()) {
    if (rank != 1)
      return emitOpError("a data-dependent trigger needs a 1-D grid, got "
                         "rank ")
             << rank;
    if (cast<EventType>(getTriggerEvent().getType()).getRank() != 1)
      return emitOpError("a data-dependent trigger needs a 1-D event, got ")
             << getTriggerEvent().getType();
    if (body.getNumArguments() != 2)
      return emitOpError("with a data-dependent trigger expects two block "
                         "arguments (the instance and its trigger "
                         "coordinate), got ")
             << body.getNumArguments();
  } else if (static_cast<int64_t>(body.getNumArguments()) != rank) {
    return emitOpError("expects one block argument per grid dimension (")
           << rank << "), got " << body.getNumArguments();
  }
  for (BlockArgument arg : body.getArguments())
    if (!arg.getType().isIndex())
      return emitOpError("grid coordinates must be index, got ")
             << arg.getType();
  return success();
}

SmallVector<OpFoldResult> DispatchOp::getMixedGrid() {
  return getMixedValues(getStaticGrid(), getDynamicGrid(), getContext());
}

#define GET_OP_CLASSES
#include "etc/Dialect/ETensor/IR/ETensorOps.cpp.inc"
