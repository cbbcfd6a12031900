"""The gateway: the HTTP surface (``app``, ``serve``, ``cli``) over rooms that each do one job.

- ``serving``: a generation request's path, from the socket to the relayed answer.
- ``dispatch``: this process's load on each backend and the prefill state per replica (the dispatch ticket).
- ``control``: the config, its live edits and versions, the catalog of backends and routes it builds.
- ``tenancy``: keys, tenants and what they may read of their spend.
- ``accounting``: budgets, rate limits, the ledger and what each finished request books there.
- ``observability``: metrics and the dashboard; ``capacity`` and ``plan``: replica advice.
- ``state``: the one object that owns all of it for a running gateway.
"""
