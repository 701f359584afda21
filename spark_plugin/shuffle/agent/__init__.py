"""Runs in the executor's agent process: the map-output service (``service``), its TTL and disk
figures (``ttl``, ``disk_usage``) and what it does with a damaged output (``corrupt_outputs``)."""
