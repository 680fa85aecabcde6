"""The broker's half of the instance agent: what an attempt is told at boot (`attempt_spec`), the agent wheel
published where instances fetch it (`publish`) and the object layout of checkpoints and mailboxes
(`checkpoint_layout`). The agent itself is `agent/`, which imports nothing of ours.

May import: `agent.protocol` (the shared contract), `providers/`, `broker.config` and `broker.api.auth` (callback
tokens).
"""
