"""pytest's side of the harness: the ``spark`` marker and shards (``markers``, ``shards``), the shared
sessions and their fixtures (``apps``), the frozen-executor runs (``frozen``). What benchmarks use
too lives in the top-level ``harness`` package, which imports nothing from here."""
