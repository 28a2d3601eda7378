"""The pure scheduling core: no I/O, no Kubernetes, no wall clock."""
