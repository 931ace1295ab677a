"""The one compiled part: the batch validator's record walk (stonemq/protocol/_recordscan.c).

Everything else is in pyproject.toml. The extension is optional: without a C compiler the
package installs and stonemq.protocol.record_batch falls back to its pure-Python walk, which
follows the same rules, only slower.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "stonemq.protocol._recordscan",
            ["stonemq/protocol/_recordscan.c"],
            optional=True,
            extra_compile_args=["-O2"],
        )
    ]
)
