# RUN: %python %s | FileCheck %s
# REQUIRES: bindings_python
"""Every etensor op and type built from Python with the generated builders."""

from etc import ir
from etc.dialects import arith, etensor, func

DYN = ir.ShapedType.get_dynamic_size()


def run(f):
    print("\nTEST:", f.__name__)
    with ir.Context(), ir.Location.unknown():
        f()
    return f


# CHECK-LABEL: TEST: types
@run
def types():
    # CHECK: !etensor.event<?x4> [None, 4] 2
    event = etensor.EventType.get([None, 4])
    print(event, event.shape, event.rank)
    # CHECK: !etensor.event<>
    print(etensor.EventType.get([]))
    # CHECK: !etensor.queue
    print(etensor.QueueType.get())
    # CHECK: isinstance True False
    parsed = ir.Type.parse("!etensor.event<?>")
    print(
        "isinstance", isinstance(parsed, etensor.EventType), isinstance(parsed, etensor.QueueType)
    )
    # CHECK: ValueError: event dimensions must be >= 0 or None
    try:
        etensor.EventType.get([-2])
    except ValueError as e:
        print("ValueError:", e)


# CHECK-LABEL: TEST: graph_level
@run
def graph_level():
    index = ir.IndexType.get()
    f32 = ir.F32Type.get()
    a_type = ir.MemRefType.get([DYN, 256], f32)
    b_type = ir.MemRefType.get([DYN, 4], f32)
    c_type = ir.MemRefType.get([DYN], f32)
    i32_table = ir.MemRefType.get([DYN], ir.IntegerType.get_signless(32))
    module = ir.Module.create()
    with ir.InsertionPoint(module.body):
        func.FuncOp(
            "partial", ([index, index, a_type, b_type], [])
        ).sym_visibility = ir.StringAttr.get("private")
        func.FuncOp("final", ([index, b_type, c_type], [])).sym_visibility = ir.StringAttr.get(
            "private"
        )
        graph = etensor.GraphOp("splitk", [index, a_type, b_type, c_type, i32_table])
    n, a, b, c, table = graph.arguments
    event_type = etensor.EventType.get([None])
    rows = ir.AffineMap.get(2, 0, [ir.AffineDimExpr.get(0)])
    same = ir.AffineMap.get_identity(1)
    with ir.InsertionPoint(graph.entry_block):
        e = etensor.event(event_type, [n], static_wait_count=4, name="E")
        k = arith.muli(n, arith.constant(index, 4))
        etensor.event(event_type, [n], wait_count=k)
        etensor.event(event_type, [n], wait_count_table=table)
        etensor.TaskOp("partial", [n], [DYN, 4], [a, b], [], [], [e], [rows], name="partial")
        etensor.TaskOp("final", [n], [DYN], [b, c], [e], [same], [], [])
    # CHECK: etensor.graph @splitk(%[[N:.*]]: index, %{{.*}}: memref<?x256xf32>, %{{.*}}: memref<?x4xf32>, %{{.*}}: memref<?xf32>, %{{.*}}: memref<?xi32>)
    # CHECK: %[[E:.*]] = etensor.event(%[[N]]) count 4 {name = "E"} : !etensor.event<?>
    # CHECK: etensor.event(%[[N]]) count %{{.*}} : !etensor.event<?>
    # CHECK: etensor.event(%[[N]]) count from %{{.*}} : memref<?xi32> : !etensor.event<?>
    # CHECK: etensor.task @partial grid [%[[N]], 4] {{.*}} outs(%[[E]][(d0, d1) -> (d0)] : !etensor.event<?>) {name = "partial"}
    # CHECK: etensor.task @final grid [%[[N]]] {{.*}} ins(%[[E]][(d0) -> (d0)] : !etensor.event<?>)
    print(module)
    # CHECK: verified True
    print("verified", module.operation.verify())


# CHECK-LABEL: TEST: schedule_level
@run
def schedule_level():
    index = ir.IndexType.get()
    module = ir.Module.create()
    with ir.InsertionPoint(module.body):
        indptr_type = ir.MemRefType.get([DYN], ir.IntegerType.get_signless(32))
        graph = etensor.GraphOp("sched", [index, index, indptr_type])
    n, capacity, _ = graph.arguments
    event_type = etensor.EventType.get([None])
    with ir.InsertionPoint(graph.entry_block):
        e = etensor.event(event_type, [n], static_wait_count=1)
        q = etensor.queue(etensor.QueueType.get(), capacity)
        worker = etensor.WorkerOp(etensor.ScheduleKind.Dynamic, queue=q)
        with ir.InsertionPoint(worker.entry_block):
            dispatch = etensor.DispatchOp(0, [n], [DYN])
            with ir.InsertionPoint(dispatch.entry_block):
                (i,) = dispatch.coordinates
                etensor.wait(e, [i])
                done = etensor.notify(ir.IntegerType.get_signless(1), e, [i])
                etensor.push(q, 0, i, count=n)
                etensor.retire(q, n)
                etensor.yield_()
            triggered = etensor.DispatchOp(
                1, [n], [DYN], trigger_event=e, trigger_indptr=graph.arguments[2]
            )
            with ir.InsertionPoint(triggered.entry_block):
                assert len(triggered.coordinates) == 2  # (i, c)
                etensor.yield_()
    with ir.InsertionPoint(module.body):
        f = func.FuncOp("popper", ([etensor.QueueType.get()], []))
        with ir.InsertionPoint(f.add_entry_block()):
            i1 = ir.IntegerType.get_signless(1)
            etensor.pop(i1, index, index, f.arguments[0])
            func.ReturnOp([])
    # CHECK: etensor.worker dynamic(%{{.*}} : !etensor.queue) {
    # CHECK: etensor.dispatch 0 grid [%{{.*}}] {
    # CHECK: etensor.wait
    # CHECK: etensor.notify {{.*}} -> i1
    # CHECK: etensor.push %{{.*}}[0, %{{.*}}] count %{{.*}} : !etensor.queue
    # CHECK: etensor.retire %{{.*}} count %{{.*}} : !etensor.queue
    # CHECK: etensor.dispatch 1 grid [%{{.*}}] triggered_by(%{{.*}}, %{{.*}} : !etensor.event<?>, memref<?xi32>) {
    # CHECK-NEXT: ^bb0(%{{.*}}: index, %{{.*}}: index):
    # CHECK: etensor.pop
    print(module)
    print("done" if done is not None else "")


# CHECK-LABEL: TEST: invalid_ir_raises
@run
def invalid_ir_raises():
    index = ir.IndexType.get()
    module = ir.Module.create()
    with ir.InsertionPoint(module.body):
        graph = etensor.GraphOp("bad", [index])
    with ir.InsertionPoint(graph.entry_block):
        # Two size operands for a one-'?' event: the verifier must reject it.
        etensor.event(etensor.EventType.get([None]), list(graph.arguments) * 2, static_wait_count=1)
    # CHECK: verify: 'etensor.event' op expects one size operand per '?' dimension
    try:
        module.operation.verify()
    except ir.MLIRError as e:
        print("verify:", e.error_diagnostics[0].message)
    # CHECK: parse: 'etensor.task' op callee 'nowhere' does not name a func.func device function
    try:
        ir.Module.parse("etensor.graph @g(%n: index) {\n etensor.task @nowhere grid [%n]\n}")
    except ir.MLIRError as e:
        print("parse:", e.error_diagnostics[0].message)
    # CHECK: still alive
    print("still alive")
