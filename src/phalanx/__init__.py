"""Phalanx: a scheduler for AI workloads on Kubernetes."""

__version__ = "0.1.0"
