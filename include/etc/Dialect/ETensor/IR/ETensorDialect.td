//===- ETensorDialect.td - Event tensor dialect ------------*- tablegen -*-===//
//
// Part of ETC, the Event Tensor Compiler.
//
//===----------------------------------------------------------------------===//

#ifndef ETC_DIALECT_ETENSOR_IR_ETENSORDIALECT_TD
#define ETC_DIALECT_ETENSOR_IR_ETENSORDIALECT_TD

include "mlir/IR/OpBase.td"

def ETensor_Dialect : Dialect {
  let name = "etensor";
  let summary = "Event tensors: dependencies between tiled GPU tasks.";
  let description = [{
    The `etensor` dialect describes a *megakernel*: a graph of tiled tasks
    that runs as one persistent GPU kernel. Dependencies between task
    instances are *event tensors*, arrays of counters whose shapes may be
    symbolic. The dialect has two levels.

    *Graph level* (what users write): `etensor.graph` holds one megakernel,
    `etensor.event` declares an event tensor and its wait counts, and
    `etensor.task` launches a device function over a task grid, with
    in-edges and out-edges given as affine maps from the task grid to event
    coordinates.

    *Schedule level* (what the scheduling passes produce): `etensor.worker`
    is the per-CTA loop of a persistent kernel, `etensor.dispatch` runs one
    task instance, and `etensor.wait`, `etensor.notify`, `etensor.push` and
    `etensor.pop` are the synchronisation primitives that
    `convert-etensor-to-gpu` lowers to acquire/release atomics in global
    memory.

    The semantics follow the Event Tensor paper (MLSys 2026): a counter
    starts at zero, every notification adds one with release semantics, and
    a waiter proceeds once an acquire load sees the counter reach the
    coordinate's wait count.
  }];
  let cppNamespace = "::mlir::etensor";
  let useDefaultTypePrinterParser = 1;
  let extraClassDeclaration = [{
    void registerTypes();
  }];
  let dependentDialects = ["::mlir::func::FuncDialect"];
}

class ETensor_Op<string mnemonic, list<Trait> traits = []>
    : Op<ETensor_Dialect, mnemonic, traits>;

#endif // ETC_DIALECT_ETENSOR_IR_ETENSORDIALECT_TD
