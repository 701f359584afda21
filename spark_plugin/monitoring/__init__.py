"""Monitoring logic, named by the side that runs it: ``executor_*`` in the executor's agent,
``driver_*`` in the driver-side process beside the ResourceManager."""
