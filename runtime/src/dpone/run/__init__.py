"""`dpone run`: the composition root, the orchestrator that moves chunks under leases, the
preflight that refuses unusable tables, and the result a refused run still leaves.
"""
