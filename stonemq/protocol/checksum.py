"""CRC-32C (Castagnoli), the checksum of record batches, journal entries and producer-state
snapshots: the ``crc32c`` library's C function, loaded without its package's ``__init__``.

Why not ``from crc32c import crc32c``: the package's ``__init__`` (crc32c 2.9.post0) runs
``importlib.metadata.version("crc32c")`` and imports its command line (``argparse``), which
pulls in about 60 modules (importlib.metadata, email, zipfile, csv, gettext, argparse, ...)
that the broker never uses. Reproducer, in a fresh interpreter::

    python -c "import sys; n = len(sys.modules); import crc32c; print(len(sys.modules) - n)"

prints 60 or more, and ``/proc/self/smaps_rollup`` shows about 6 MiB more anonymous memory
than loading the extension module alone (17.4 against 11.0 MiB on this machine), a seventh
of the serving process's idle size. So the extension module ``crc32c._crc32c`` is loaded
from the package's directory by the import system's own extension loader and registered
under its name: a later ``import crc32c`` (tools, tests) finds it there. If the package's
layout ever differs, the plain import is the fallback; the function is the same either way
(``tests/unit/test_checksum.py`` checks both).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from collections.abc import Callable

_EXTENSION = "crc32c._crc32c"


def _load_extension() -> Callable[..., int] | None:
    """``crc32c._crc32c.crc32c`` without running ``crc32c/__init__.py``, or None."""
    if (loaded := sys.modules.get(_EXTENSION)) is not None:
        return loaded.crc32c  # type: ignore[no-any-return]
    package = importlib.util.find_spec("crc32c")  # a top-level spec: its __init__ is not run
    if package is None or not package.submodule_search_locations:
        return None
    for directory in package.submodule_search_locations:
        finder = importlib.machinery.FileFinder(
            directory,
            (importlib.machinery.ExtensionFileLoader, importlib.machinery.EXTENSION_SUFFIXES),
        )
        spec = finder.find_spec(_EXTENSION)
        if spec is None or spec.loader is None:
            continue
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[_EXTENSION] = module
        return module.crc32c  # type: ignore[no-any-return]
    return None


def _load() -> Callable[..., int]:
    try:
        found = _load_extension()
    except (ImportError, OSError, AttributeError):
        found = None
    if found is None:
        from crc32c import crc32c as found  # the whole package: same function, more modules
    return found


crc32c: Callable[..., int] = _load()
"""``crc32c(data, value=0) -> int``: the CRC-32C of ``data`` continuing from ``value``."""
