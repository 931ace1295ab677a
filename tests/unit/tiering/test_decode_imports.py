"""The executor side of the archive job stays light: a Spark Python worker that stages a
segment imports neither pyspark.sql (compiled from Spark's zip in every worker) nor pandas
(``pa.array`` on a Python list imports it, ~0.4 s per worker)."""

from __future__ import annotations

import subprocess
import sys

from tier_helpers import data_segments

_SCRIPT = """
import sys
from stonemq.tiering.staging import stage_task
from stonemq.tiering.rows import decode_segment
table = decode_segment(open(sys.argv[1], "rb").read(), "t", 0, 0, 10**9)
assert table.num_rows > 0, table
loaded = sorted(m for m in sys.modules if m == "pandas" or m.startswith("pyspark.sql"))
print(",".join(loaded))
"""


def test_staging_and_decoding_import_neither_pyspark_sql_nor_pandas(tmp_path) -> None:  # type: ignore[no-untyped-def]
    segment = tmp_path / "seg.log"
    segment.write_bytes(b"".join(data_segments(1, 5, 7)[0]))
    out = subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(segment)], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == ""
