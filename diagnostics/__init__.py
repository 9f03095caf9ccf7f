"""ACR statistics and monitor, metric sinks, run reports."""
