"""``spark_plugin.shuffle`` without Spark: map-output files, agents, reads, settings."""
