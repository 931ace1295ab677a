"""CRC-32C as the broker loads it (stonemq/protocol/checksum.py): the crc32c library's own
function, without the package's ``__init__`` and the modules it imports."""

from __future__ import annotations

import subprocess
import sys

import crc32c as crc32c_package
from hypothesis import given
from hypothesis import strategies as st

from stonemq.protocol.checksum import crc32c


def test_the_standard_check_value() -> None:
    assert crc32c(b"123456789") == 0xE3069283  # RFC 3720's CRC-32C check value


@given(st.binary(max_size=4096), st.integers(min_value=0, max_value=2**32 - 1))
def test_it_is_the_library_function(data: bytes, value: int) -> None:
    assert crc32c(data, value) == crc32c_package.crc32c(data, value)
    assert crc32c(data[len(data) // 2 :], crc32c(data[: len(data) // 2])) == crc32c(data)


def test_loading_it_imports_neither_the_package_nor_its_command_line() -> None:
    """In a fresh interpreter: the extension module is loaded and registered under its own
    name; the package's ``__init__`` (importlib.metadata, argparse, email, ...) never ran."""
    probe = (
        "import sys\n"
        "from stonemq.protocol.checksum import crc32c\n"
        "assert crc32c(b'123456789') == 0xE3069283\n"
        "print(' '.join(sorted(sys.modules)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    modules = set(out.stdout.split())
    assert "crc32c._crc32c" in modules
    for never in ("crc32c", "crc32c._cli", "importlib.metadata", "argparse", "email"):
        assert never not in modules, never
