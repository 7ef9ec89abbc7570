"""Bounds of each claim as functions of their parameters; symbolic lemmas; cost models."""
