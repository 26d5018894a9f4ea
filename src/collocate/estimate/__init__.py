"""Estimate GPU memory of PyTorch training jobs before they run (issue #4)."""
