"""Operators' tools: the ``arrowbeat`` command (``cli``), the HTML report, the live page and its
assets, and packing a virtual environment for executors (``pack``)."""
