"""spark-submit-able jobs and Structured Streaming queries over arrowbeat's history tables.

In the checkout they are run by path (``spark-submit $(python -m spark_plugin conf) jobs/demo.py``);
the wheel installs this folder as ``spark_plugin.jobs`` (``pyproject.toml`` maps it), which is the
name the jobs import each other by, so both ways run the same code.
"""
