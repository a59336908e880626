"""Device backends: the typed contract (contract.py) and its implementations (NVML now)."""
