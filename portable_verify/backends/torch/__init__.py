"""Eager torch on any torch device: chains, block verification and trees."""
