"""The collocate daemon: persistent queue, local API, job launching and out-of-memory recovery.

``collocate serve`` runs ``service.Service``; the other modules are its parts (see
``docs/daemon.md`` for the user guide and the state layout).
"""
