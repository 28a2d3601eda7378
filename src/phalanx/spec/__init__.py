"""Input specs: YAML clusters and workloads validated into the core model, with located errors."""
