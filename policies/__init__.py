"""Routing decisions, pure: filters, scorers and pickers over immutable snapshots, and the policies built of them.

Importing the package registers the built-in policies (:mod:`policies.builtin`) before any other can.
"""

from spillgate.policies import builtin as builtin
