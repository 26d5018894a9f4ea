"""Per-job monitoring: sampling, energy attribution on shared GPUs, storage, sinks, reports.

The daemon drives it (``sampler.UsageSampler`` once per tick, ``store.MonitorStore`` to keep it,
``sinks`` to export it); jobs only need ``log_metric`` to add their own metrics. See
``docs/monitoring.md``. Importing this package is cheap: no web, MLflow or plotting imports.
"""

from collocate.monitor.job_metrics import ENV_METRICS_FILE, log_metric

__all__ = ["ENV_METRICS_FILE", "log_metric"]
