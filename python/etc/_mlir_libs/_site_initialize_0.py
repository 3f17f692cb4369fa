"""Registers the etensor dialect in every context `etc.ir` creates."""

from ._etcDialects import register_dialects  # noqa: F401
