"""Test and demo tooling shipped with the package: a throw-away control plane and `phalanx demo`."""
