"""Remote hosts and fleets over SSH: host specs and inventories (``hosts``), the
OpenSSH transport (``ssh``), the fan-out runner (``fleet``) and the nvidia-smi
fallback for hosts without gpuslate (``smi``). The library never prints."""
