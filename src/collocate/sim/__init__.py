"""Discrete-event simulation of a GPU cluster running the real scheduler core."""
