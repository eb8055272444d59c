"""One module per group of measurements; each returns the results.json keys it measured."""
