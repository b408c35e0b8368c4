"""Cold-start SFT and the RL loop."""
