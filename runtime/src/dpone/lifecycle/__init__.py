"""What a run's process sets up around its database sessions and tears down at its end:
SIGTERM/SIGINT handling, server-side session limits, the read-ahead budget and thread, the
connections handed from one connector to the next, the garbage collector held off while it
starts, and test-only crash points.
"""
