"""The loops on top: `phalanx scheduler` (leader election, attained service) and its `--shadow` variant."""
