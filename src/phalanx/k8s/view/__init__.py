"""The operator's view: dashboard state, the metrics and dashboard endpoints (who may read them), status."""
