"""The one compiled part: the batch validator's record walk and the columnar record encoder's
pass (stonemq/protocol/_recordscan.c).

Everything else is in pyproject.toml. The extension is optional: without a C compiler the
package installs, stonemq.protocol.record_batch falls back to its pure-Python walk (the same
rules) and stonemq.protocol.arrow_records to its numpy encoder (the same bytes), only slower.
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
