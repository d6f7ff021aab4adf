"""Every contact with the outside world: processes (runner), HTTP (httpclient), NVML, ELF files,
checked downloads (fetch), and the scripts the stack's own interpreter runs (probe, deepwork)."""
