"""What a generated task tells the pod, parsed strictly before anything else: the run
identity, the mapping item and the Airflow run context (dpone-owned environment).
"""
