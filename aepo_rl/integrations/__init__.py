"""Integrations with distributed RL engines (verl)."""
