"""Real workloads the agent runs in tests (as processes and inside container images)."""
