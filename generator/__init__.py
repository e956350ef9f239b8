"""dpone generator: load, validate, plan, render, format, write."""
