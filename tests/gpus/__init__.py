"""Tests of the GPU layer (a package, so helper modules import relatively)."""
