"""Tree rollouts: entropy pre-monitoring, entropy-guided branching, consecutive-branch penalty (§1)."""
