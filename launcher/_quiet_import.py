"""Keep ``import asyncssh`` from probing for liboqs (it runs ldconfig, gcc and ld).

When it is imported, ``asyncssh.crypto.pq`` looks for liboqs with
``ctypes.util.find_library("oqs")`` and ``("liboqs")``. On Linux each call runs ``ldconfig
-p`` and, when that finds nothing, gcc and ld: 11 processes and ~25 ms on every dtrain start,
odd in a login node's process accounting. liboqs only adds post-quantum key exchanges
(sntrup761; ML-KEM comes from OpenSSL when it has it), and dtrain never offers those
(``KEX_ALGS`` in transports/ssh/settings.py). So while that one module executes, those two names
are "not found"; every other ``find_library`` call, and every other module, is untouched.

The hook sits on ``sys.meta_path`` and does nothing until asyncssh is imported, so commands
that never connect (``--help``, ``logs``) pay nothing for it.

A second one, for ``--help`` (issue 26): typer renders help through ``typer.rich_utils``,
whose first lines import ``rich.markdown`` (markdown_it, rich.syntax) and ``rich.traceback``
for two names it uses only for the "markdown" markup mode and pretty exceptions, neither
of which dtrain uses: ~50 ms of CPU, a sixth of `dtrain --help`. While that one module
executes, those two modules are placeholders whose class (``Markdown``, ``Traceback``)
imports the real one on first use (a call, an attribute, isinstance); afterwards the
placeholders leave ``sys.modules``, so any later ``import rich.markdown`` gets the real
module. The help text is the same (tests/test_cli_lean.py compares it).

A third (issue 49): cryptography ≥ 51 deprecates DSA, and warns each time a module reads one
of its ``dsa.*`` names. asyncssh reads five of them at import (type aliases in
``asyncssh.crypto.misc`` and ``asyncssh.crypto.dsa``), so every cold SSH command printed ten
lines of ``CryptographyDeprecationWarning: DSA is deprecated`` on stderr. dtrain never uses
DSA: asyncssh offers no DSA host key or signature by default and dtrain adds none
(docs/security.md). Exactly that warning is ignored: its category, its message, and only when
it is raised from asyncssh's own modules. The filter goes in as asyncssh starts to import
(so commands that never connect import nothing more), and stays, since asyncssh may read the
same names later (loading a DSA key someone passes with ``-i``). Every other warning,
cryptography's others included, still shows.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from importlib.machinery import ModuleSpec, PathFinder
from types import ModuleType

TYPE_CHECKING = False  # typing is not imported: this module runs before every command, a
if TYPE_CHECKING:  # warm one's client included (tests/test_resident.py: ~3 ms of its start)
    from typing import Any


class _WhileExecuting:
    """A meta-path finder for one module: its usual spec, executed inside ``during()``."""

    module: str

    def find_spec(self, fullname: str, path: Any = None, target: Any = None
                  ) -> ModuleSpec | None:
        if fullname != self.module:
            return None
        spec = PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        real_exec = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            with self.during():
                real_exec(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec

    def during(self) -> AbstractContextManager[None]:
        raise NotImplementedError


PROBING_MODULE = "asyncssh.crypto.pq"
OQS_NAMES = frozenset({"oqs", "liboqs"})


class _NoOqsProbe(_WhileExecuting):
    """asyncssh.crypto.pq executed without the probe: the two liboqs names are not found."""

    module = PROBING_MODULE

    @contextmanager
    def during(self) -> Iterator[None]:
        import ctypes.util

        real = ctypes.util.find_library

        def find_library(name: str) -> str | None:
            return None if name in OQS_NAMES else real(name)

        ctypes.util.find_library = find_library
        try:
            yield
        finally:
            ctypes.util.find_library = real


HELP_MODULE = "typer.rich_utils"
DEFERRED = {"rich.markdown": "Markdown", "rich.traceback": "Traceback"}


class _Deferred(type):
    """The metaclass of a placeholder class: the real class is imported on first use."""

    _module: str

    def real(cls) -> Any:
        import importlib

        return getattr(importlib.import_module(cls._module), cls.__name__)

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        return cls.real()(*args, **kwargs)

    def __getattr__(cls, name: str) -> Any:  # Traceback.from_exception ...
        return getattr(cls.real(), name)

    def __instancecheck__(cls, obj: object) -> bool:
        return isinstance(obj, cls.real())


class _HelpWithoutMarkdown(_WhileExecuting):
    """typer.rich_utils executed with DEFERRED as placeholders."""

    module = HELP_MODULE

    @contextmanager
    def during(self) -> Iterator[None]:
        placed = {}
        for name, cls in DEFERRED.items():
            if name not in sys.modules:
                stub = ModuleType(name)
                setattr(stub, cls, _Deferred(cls, (), {"_module": name}))
                placed[name] = sys.modules[name] = stub
        try:
            yield
        finally:
            for name, stub in placed.items():
                if sys.modules.get(name) is stub:
                    del sys.modules[name]


ASYNCSSH = "asyncssh"
DSA_MESSAGE = r"DSA is deprecated"
ASYNCSSH_MODULES = r"asyncssh(\.|$)"


def silence_asyncssh_dsa_warning() -> None:
    """Ignore cryptography's DSA deprecation where asyncssh raises it, and nothing else."""
    import warnings

    try:
        from cryptography.utils import CryptographyDeprecationWarning
    except ImportError:  # asyncssh will say that cryptography is missing, not this
        return
    warnings.filterwarnings("ignore", message=DSA_MESSAGE,
                            category=CryptographyDeprecationWarning, module=ASYNCSSH_MODULES)


class _AsyncsshWithoutDsaWarning(_WhileExecuting):
    """asyncssh's package imported with the one DSA warning filtered (it stays filtered)."""

    module = ASYNCSSH

    @contextmanager
    def during(self) -> Iterator[None]:
        silence_asyncssh_dsa_warning()
        yield


def install() -> None:
    """Put the finders first on sys.meta_path (once)."""
    for finder in (_NoOqsProbe, _HelpWithoutMarkdown, _AsyncsshWithoutDsaWarning):
        if not any(isinstance(f, finder) for f in sys.meta_path):
            sys.meta_path.insert(0, finder())
