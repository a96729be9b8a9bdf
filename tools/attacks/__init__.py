"""The attacks of `tools/attack_suite.py`, by what they need: files, the server and its probe, the suite
that runs them one at a time, and the attacks themselves (one visitor's, load)."""
