"""The instance agent: the program each instance runs for one job attempt (see `agent.protocol`).

It imports nothing from `broker`, `providers`, `pricing` or `federation` and only the standard library, so the
broker can publish it as a small wheel that instances run without a package index.
"""
