"""``stonemq serve`` with the storage's system calls going through ``faults.FaultyFileOps``:
``python faulty_serve.py RULES-JSON SERVE-FLAGS...``, where RULES-JSON is a list of
``faults.Rule`` fields (op, match, error, times, after, short). For tests that inject I/O
errors into a real broker process (tests/integration/test_zero_copy_fetch.py)."""

from __future__ import annotations

import json
import sys

from stonemq.cli.serve import main
from stonemq.storage import fileio
from stonemq.storage.faults import FaultPlan, FaultyFileOps, Rule

if __name__ == "__main__":
    plan = FaultPlan()
    plan.rules.extend(Rule(**rule) for rule in json.loads(sys.argv[1]))
    fileio.install(FaultyFileOps(plan))
    sys.exit(main(sys.argv[2:], in_process=True))  # the faults are installed in this process
