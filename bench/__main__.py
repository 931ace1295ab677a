"""Entry point of ``python -m bench``: hands over to :func:`bench.run.main`."""

from bench.run import main

raise SystemExit(main())
