"""collocate: let several deep-learning training jobs share GPUs safely and fast."""

__version__ = "0.1.0"
