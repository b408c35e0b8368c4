"""Tasks: the built-in synthetic world, user data, reasoning-gym, evaluation sets."""

from aepo_rl.tasks.base import Demonstration, Example, Task

__all__ = ["Demonstration", "Example", "Task"]
