//===- ETensorTypes.cpp - Event tensor types ------------------------------===//
//
// Part of ETC, the Event Tensor Compiler.
//
//===----------------------------------------------------------------------===//

#include "etc/Dialect/ETensor/IR/ETensorTypes.h"
#include "etc/Dialect/ETensor/IR/ETensorDialect.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/DialectImplementation.h"
#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;
using namespace mlir::etensor;

#define GET_TYPEDEF_CLASSES
#include "etc/Dialect/ETensor/IR/ETensorOpsTypes.cpp.inc"

void ETensorDialect::registerTypes() {
  addTypes<
#define GET_TYPEDEF_LIST
#include "etc/Dialect/ETensor/IR/ETensorOpsTypes.cpp.inc"
      >();
}

/// `<` (`?` | int) (`x` (`?` | int))* `>`, or `<>` for a single counter.
Type EventType::parse(AsmParser &parser) {
  SmallVector<int64_t> shape;
  if (parser.parseLess())
    return {};
  if (succeeded(parser.parseOptionalGreater()))
    return getChecked([&] { return parser.emitError(parser.getNameLoc()); },
                      parser.getContext(), shape);
  if (parser.parseDimensionList(shape, /*allowDynamic=*/true,
                                /*withTrailingX=*/false) ||
      parser.parseGreater())
    return {};
  return getChecked([&] { return parser.emitError(parser.getNameLoc()); },
                    parser.getContext(), shape);
}

void EventType::print(AsmPrinter &printer) const {
  printer << "<";
  llvm::interleave(
      getShape(), printer.getStream(),
      [&](int64_t dim) {
        if (ShapedType::isDynamic(dim))
          printer << "?";
        else
          printer << dim;
      },
      "x");
  printer << ">";
}

LogicalResult EventType::verify(function_ref<InFlightDiagnostic()> emitError,
                                ArrayRef<int64_t> shape) {
  for (int64_t dim : shape)
    if (!ShapedType::isDynamic(dim) && dim < 0)
      return emitError() << "event dimensions must be non-negative or '?', got "
                         << dim;
  return success();
}

int64_t EventType::getNumDynamicDims() const {
  return llvm::count_if(getShape(), ShapedType::isDynamic);
}
