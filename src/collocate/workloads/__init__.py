"""Built-in PyTorch workloads on synthetic data, and adapters for model zoos."""
