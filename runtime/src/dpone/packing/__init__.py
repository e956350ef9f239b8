"""A workload compiled into its pack, the environment its tasks pass, and the checks that the
pod's recompiled pack and plan are the ones the DAG file was made from.
"""
