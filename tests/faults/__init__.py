"""Fault injection for tests: power-loss emulation of real processes (powerloss.py)."""
