"""Modules imported on first use, so a command loads only what it runs: a ``get`` or ``put``
starts without the packet and admin code, cryptography or zstd (every module a command imports
costs its start, and more where bytecode is not cached)."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any


class OnFirstUse(ModuleType):
    """Stands for module ``name`` until an attribute is asked for, then imports it and
    takes its namespace (later lookups are plain attribute reads)."""

    def __init__(self, name: str):
        super().__init__(name)

    def __getattr__(self, attr: str) -> Any:
        module = importlib.import_module(self.__name__)
        self.__dict__.update(module.__dict__)
        return getattr(module, attr)
