"""What the client and the daemon both speak: the protocol, its schema and rights, the state dir's
paths and the submit spec. The client imports this, never the daemon."""
