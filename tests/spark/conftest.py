"""Spark fixtures: one session per test module (Spark start-up is the expensive part)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from tests.spark.session import build_session, stop_session


@pytest.fixture(scope="module")
def spark_local(scratch: Path, request: pytest.FixtureRequest) -> Iterator[SparkSession]:
    """``local[2]`` with arrowbeat and Delta on."""
    spark = build_session("local[2]", scratch, f"test-{request.module.__name__}")
    yield spark
    stop_session(spark)


@pytest.fixture(scope="module")
def spark_cluster(scratch: Path, request: pytest.FixtureRequest) -> Iterator[SparkSession]:
    """``local-cluster[2,1,1024]``: two real executor JVMs, each with its own arrowbeat agent."""
    spark = build_session("local-cluster[2,1,1024]", scratch, f"test-{request.module.__name__}")
    yield spark
    stop_session(spark)
