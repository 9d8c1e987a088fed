"""``gpuslate exporter``: Prometheus metrics of who holds GPU memory, by job, user and unit.

Device exporters (dcgm-exporter, the nvidia-smi ones) stop at the GPU; this one
says which process, job, user and managed unit holds the memory, and shows the
memory that outlives its job (leaked contexts, workers whose launcher exited),
from the same snapshot and job rule as ``gpuslate status``.

- :mod:`.model`: the series, a pure function of the facts one scrape gathered;
- :mod:`.auditlog`: clear runs and signals by outcome, read incrementally from the audit log;
- :mod:`.collector`: the scrape (one fresh reading, bounded in time) as a prometheus_client collector;
- :mod:`.server`: the HTTP server (``/metrics``, ``/healthz``) and the listen-address rule.

prometheus_client is an extra (``pip install '.[exporter]'`` in a clone): only
:mod:`.collector` and :mod:`.server` import it, and nothing outside this
package imports them, so no other command pays for it.
"""

from __future__ import annotations

SCHEMA = "gpuslate.exporter.v1"
#: 127.0.0.1:9847; the exporter port range 9100-9999 is fully allocated, and this port is clear of
#: the GPU exporters a host may already run (dcgm-exporter 9400, nvidia_gpu_exporter 9835, 9401, 9445)
DEFAULT_PORT = 9847
DEFAULT_LISTEN = f"127.0.0.1:{DEFAULT_PORT}"
