"""Modules imported on first use, so a command loads only what it runs: a ``get`` or ``put``
starts without the packet and admin code, cryptography or zstd (every module a command imports
costs its start, and more where bytecode is not cached)."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any


class OnFirstUse(ModuleType):
    """Stands for module ``name``: the first attribute asked for imports it, and every
    lookup reads the module's attribute as it is then (a copy of its namespace, taken once,
    would not see a name the module rebinds later, such as a test's stand-in)."""

    def __init__(self, name: str):
        super().__init__(name)

    def __getattr__(self, attr: str) -> Any:
        return getattr(importlib.import_module(self.__name__), attr)
