"""Monitoring logic, named by the side that runs it: ``executor_*`` in the executor's agent,
``driver_*`` in the driver-side process beside the ResourceManager; ``gaps`` (pure: what a silence
of the executor JVM was) is the classifier both sides share."""
