"""Overspill test suite."""
