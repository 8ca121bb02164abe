"""The adapters of ``benchmarks/e2e_workers.py``: one module per system, each run in that system's
own virtual environment by the driver (``python -m benchmarks.e2e_peers.NAME CONFIG``).

Only :mod:`.ours` imports ``scheduler``; every other module needs nothing but its peer and the
standard library (:mod:`.protocol`).
"""
