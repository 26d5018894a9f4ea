"""Several GPU servers as one collocate cluster on Ray (``collocate serve --ray``).

``agent.py`` is what each node does (Ray-free); ``ray_head.py`` is the only module that imports
Ray: it starts an agent actor per node and gives the daemon a ``ClusterBackend`` and a
``ClusterExecutor``. Single-node mode imports neither. See docs/multi-node.md.
"""
