"""The act side: a cycle's decisions -> API calls (binds, evictions, GPU shares, staging, explanations)."""
