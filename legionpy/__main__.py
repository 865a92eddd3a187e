"""``python -m legionpy CMD ...``: the ``legionpy`` command without an
installed console script (a checkout on ``PYTHONPATH``, e.g. on a lent GPU
machine that cannot ``pip install``)."""

from __future__ import annotations

from .cli import main

raise SystemExit(main())
