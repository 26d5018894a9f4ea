"""Errors of shared data loading.

Each names what happened and the next step, so a training script that dies on one prints a line
a user can act on instead of a traceback from a socket call.
"""

from __future__ import annotations

from collocate.common.errors import CollocateError, InputError


class ShareError(CollocateError):
    """Base class of every shared-loading failure."""


class ShareUnsupportedError(ShareError):
    """The platform lacks what the transport needs (Linux memfd, SOCK_SEQPACKET, fd passing)."""


class LayoutError(InputError):
    """A batch cannot be placed in the ring: wrong type, or a shape/dtype that differs from the first."""


class ProducerNotFoundError(ShareError):
    """No producer answers under the requested name."""


class ProducerExistsError(ShareError):
    """Another live producer already serves this name."""


class ProducerLostError(ShareError):
    """The producer died, hung or shut down while a consumer was attached."""


class ConsumerDetachedError(ShareError):
    """The producer detached this consumer (too slow, unresponsive, or a protocol violation)."""


class ProtocolError(ShareError):
    """A peer sent a message that does not follow the wire format."""


class RingCorruptionError(ShareError):
    """A slot was overwritten while this consumer still used it (only after a detach)."""
