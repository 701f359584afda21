"""Runs in the user's driver process: the public API (``dataframe``, ``grouped``), which exchange a
call takes (``route``, ``takeover``), planning (``session``, ``adaptive``, ``direct_scan``) and the
pipelined shuffles' directory (``rendezvous``). Never imported by worker- or agent-side code."""
