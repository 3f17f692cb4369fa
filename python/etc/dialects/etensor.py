"""The `etensor` dialect: generated op builders plus the event and queue types."""

from .._mlir_libs._etcDialects.etensor import EventType, QueueType  # noqa: F401
from ._etensor_enum_gen import *  # noqa: F401,F403
from ._etensor_ops_gen import *  # noqa: F401,F403
