"""The `etensor` dialect: generated op builders, the event and queue types, and
thin extensions that create the entry blocks of region-holding ops."""

from .._mlir_libs._etcDialects.etensor import EventType, QueueType  # noqa: F401
from ..ir import FunctionType, IndexType, TypeAttr
from ._etensor_enum_gen import *  # noqa: F401,F403
from ._etensor_ops_gen import *  # noqa: F401,F403
from ._etensor_ops_gen import DispatchOp as _DispatchOp
from ._etensor_ops_gen import GraphOp as _GraphOp
from ._etensor_ops_gen import WorkerOp as _WorkerOp
from ._etensor_ops_gen import _Dialect
from ._ods_common import _cext as _ods_cext


@_ods_cext.register_operation(_Dialect, replace=True)
class GraphOp(_GraphOp):
    """`etensor.graph @name(args)`: created with its entry block."""

    def __init__(self, sym_name, arg_types, *, loc=None, ip=None):
        function_type = TypeAttr.get(FunctionType.get(list(arg_types), []))
        super().__init__(sym_name, function_type, loc=loc, ip=ip)
        self.regions[0].blocks.append(*arg_types)

    @property
    def entry_block(self):
        return self.regions[0].blocks[0]

    @property
    def arguments(self):
        return self.entry_block.arguments


@_ods_cext.register_operation(_Dialect, replace=True)
class WorkerOp(_WorkerOp):
    """`etensor.worker`: created with its (empty) body block."""

    def __init__(self, schedule, *, queue=None, loc=None, ip=None):
        super().__init__(schedule, queue=queue, loc=loc, ip=ip)
        self.regions[0].blocks.append()

    @property
    def entry_block(self):
        return self.regions[0].blocks[0]


@_ods_cext.register_operation(_Dialect, replace=True)
class DispatchOp(_DispatchOp):
    """`etensor.dispatch`: created with one `index` block argument per grid
    dimension (the instance's coordinates), plus the trigger coordinate when
    `trigger_event`/`trigger_indptr` make it a data-dependent trigger."""

    def __init__(
        self,
        task,
        dynamic_grid,
        static_grid,
        *,
        trigger_event=None,
        trigger_indptr=None,
        loc=None,
        ip=None,
    ):
        super().__init__(
            task,
            dynamic_grid,
            static_grid,
            trigger_event=trigger_event,
            trigger_indptr=trigger_indptr,
            loc=loc,
            ip=ip,
        )
        coordinates = len(static_grid) + (trigger_event is not None)
        self.regions[0].blocks.append(*([IndexType.get()] * coordinates))

    @property
    def entry_block(self):
        return self.regions[0].blocks[0]

    @property
    def coordinates(self):
        return self.entry_block.arguments
