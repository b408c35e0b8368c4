"""aepo-rl: Agentic Entropy-Balanced Policy Optimization (arXiv 2510.14545) and its baselines."""

__version__ = "0.1.0"
