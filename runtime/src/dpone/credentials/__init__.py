"""Connections and their secrets: a connection name resolved to its DSN from the environment
(whole or assembled from parts), the DSN as each driver reads it, the connect settings that
make a configuration error, and the redaction applied wherever text leaves dpone.
"""
