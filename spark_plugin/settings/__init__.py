"""Settings: every ``spark.arrowbeat.*`` key (declared once), units, TLS settings, optional extras.

Imports nothing of the plugin above it; every other room reads its settings from here.
"""
