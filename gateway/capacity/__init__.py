"""Live capacity advice: how many replicas each pool needs now, from what the gateway measures.

``series`` keeps bounded per-bucket counts, ``recorder`` turns finished requests and replica load samples into
them, ``advice`` is the pure arithmetic (shared with ``spillgate plan``), and ``api`` serves ``GET /capacity`` and
the ``/metrics`` gauges. Nothing is imported here, so ``spillgate plan`` loads only the arithmetic it needs.
"""
