"""Operators' tools: the ``arrowbeat`` command (``cli``), the HTML report (``report`` lays it out,
``report_plots`` draws its figures; the history comes from ``spark_plugin.history.reader``), the
live page and its assets, what several of them show alike (``views``), and packing a virtual
environment for executors (``pack``)."""
