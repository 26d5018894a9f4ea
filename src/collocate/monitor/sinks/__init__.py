"""Where monitoring data goes besides the store: MLflow runs and a Prometheus endpoint.

Every sink implements ``base.Sink``; the daemon holds them in a ``base.SinkSet``, which wraps
each in ``GuardedSink`` so a failing sink degrades tracking without stopping scheduling. The
MLflow and Prometheus modules import their libraries, so import them only when configured.
"""

from collocate.monitor.sinks.base import GuardedSink, JobInfo, Sink, SinkSet

__all__ = ["GuardedSink", "JobInfo", "Sink", "SinkSet"]
