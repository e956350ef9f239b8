"""What a run tells the outside: the run result and evidence, exit codes and error lines,
progress lines, OpenTelemetry metrics, OpenLineage events, their exporters, phase timing.
"""
