//===- ETensorTypes.td - Event tensor types ----------------*- tablegen -*-===//
//
// Part of ETC, the Event Tensor Compiler.
//
//===----------------------------------------------------------------------===//

#ifndef ETC_DIALECT_ETENSOR_IR_ETENSORTYPES_TD
#define ETC_DIALECT_ETENSOR_IR_ETENSORTYPES_TD

include "etc/Dialect/ETensor/IR/ETensorDialect.td"
include "mlir/IR/AttrTypeBase.td"

class ETensor_Type<string name, string typeMnemonic, list<Trait> traits = []>
    : TypeDef<ETensor_Dialect, name, traits> {
  let mnemonic = typeMnemonic;
}

def ETensor_EventType : ETensor_Type<"Event", "event"> {
  let summary = "A tensor of dependency counters";
  let description = [{
    An event tensor: one counter per coordinate. Dimensions are static
    integers or `?`; a `?` dimension is bound by an `index` operand of the
    `etensor.event` op that declares the tensor. A rank-0 event (`<>`) is a
    single counter.

    Example:

    ```mlir
    !etensor.event<?>       // one counter per row, row count symbolic
    !etensor.event<?x4>     // a symbolic-by-4 grid of counters
    !etensor.event<>        // one counter
    ```
  }];
  let parameters = (ins ArrayRefParameter<"int64_t", "event shape">:$shape);
  let hasCustomAssemblyFormat = 1;
  let genVerifyDecl = 1;
  let extraClassDeclaration = [{
    int64_t getRank() const { return getShape().size(); }
    /// Number of `?` dimensions, i.e. of size operands its declaration takes.
    int64_t getNumDynamicDims() const;
  }];
}

def ETensor_QueueType : ETensor_Type<"Queue", "queue"> {
  let summary = "A ring of ready task descriptors in global memory";
  let description = [{
    The task queue of dynamic scheduling: a multi-producer multi-consumer
    ring in global memory. Each slot holds one task descriptor (task index
    and linear instance index) and a ready flag.

    Example:

    ```mlir
    %q = etensor.queue capacity %cap : !etensor.queue
    ```
  }];
}

def ETensor_AnyEvent : Type<CPred<"::llvm::isa<::mlir::etensor::EventType>($_self)">,
                            "event tensor", "::mlir::etensor::EventType">;

#endif // ETC_DIALECT_ETENSOR_IR_ETENSORTYPES_TD
