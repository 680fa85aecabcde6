"""Example workloads that follow the agent's workload contract (agent/protocol.py); run with `python3 -m
examples.train_numpy` (installed with the project) or `python3 examples/train_numpy.py`."""
